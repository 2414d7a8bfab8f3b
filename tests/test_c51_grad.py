"""The hand-derived C51 gradient of the built-in q_mlp with atoms (rlrun/models/c51_grad.py) against
autograd's ``dqn_td``: the same loss, cross-entropies, stats and parameter gradients (the noisy heads'
noise scales included) for every option it covers; autograd for what it does not cover; the same
learning over a Rainbow iteration with prioritized replay."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.algos.dqn import DQNConfig, project_distribution
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.c51_grad import C51Grad
from rlrun.models.q_networks import QMLPConfig
from rlrun.policy.policy import LossOutput, Policy
from rlrun.sources.plugins import load_builtins
from tests.conftest import (
    assert_a_nan_reward_leaves_the_weights,
    assert_the_same_dqn_step,
    autograd_step,
    dqn_policy_with_another_target,
)

load_builtins()
OBS, ACT = gym.spaces.Box(-2, 2, (3, 2), np.float32), gym.spaces.Discrete(3)


def policy(hand: bool, *, dueling: bool = True, double_q: bool = True, noisy: bool = True,
           activation: str = "relu", prioritized: bool = False, **model: object) -> Policy:
    m = QMLPConfig(hiddens=[32, 16], dueling=dueling, activation=activation, noisy=noisy,  # type: ignore[arg-type]
                   **{"num_atoms": 11, "v_min": -5.0, "v_max": 5.0, **model})
    a = DQNConfig(double_q=double_q, hand_gradient=hand, learning_starts=0, sgd_minibatch_size=64,
                  training_intensity=4.0, grad_clip=10.0, target_network_update_freq=10**9,
                  prioritized_replay=prioritized)
    return dqn_policy_with_another_target(OBS, ACT, m, a, seed=0)


def minibatch(n: int = 64, weights: bool = False, seed: int = 1) -> dict[str, torch.Tensor]:
    """Rewards spread so that targets fall inside the support, on its atoms' edges and clipped at both ends."""
    g = torch.Generator().manual_seed(seed)
    mb = {SB.OBS: 2 * torch.randn(n, 3, 2, generator=g), SB.ACTIONS: torch.randint(0, 3, (n,), generator=g),
          SB.NSTEP_NEXT_OBS: 2 * torch.randn(n, 3, 2, generator=g), SB.NSTEP_REWARDS: 3 * torch.randn(n, generator=g),
          SB.NSTEP_DISCOUNT: torch.full((n,), 0.97)}
    mb[SB.NSTEP_DISCOUNT][:8] = 0.0  # terminal rows: all mass at the reward
    mb[SB.NSTEP_REWARDS][:4] = torch.tensor([-5.0, 1.0, 2.0, 7.0])  # on an atom, and beyond v_max
    if weights:
        mb[SB.WEIGHTS] = torch.rand(n, generator=g) + 0.1
    return mb



CASES = list(itertools.product([True, False], [True, False], [True, False], [False, True], ["relu", "tanh"]))


@pytest.mark.parametrize(("dueling", "double_q", "noisy", "weights", "activation"), CASES)
def test_the_hand_gradient_equals_autograds(dueling, double_q, noisy, weights, activation):
    """Dueling or not, double Q or not, noisy heads or plain, importance weights or not, ReLU or tanh:
    with the same seed for the noise, the loss, the per-row cross-entropies (the priorities' TD
    errors), the stats and every parameter's gradient match autograd's to float rounding."""
    hand, ref = (policy(h, dueling=dueling, double_q=double_q, noisy=noisy, activation=activation)
                 for h in (True, False))
    assert hand.hand_gradient is not None and ref.hand_gradient is None
    mb = minibatch(weights=weights)
    mb_ref = dict(mb)
    torch.manual_seed(7)
    out = hand.hand_gradient(mb)
    torch.manual_seed(7)
    out_ref = autograd_step(ref, mb_ref)
    assert_the_same_dqn_step(hand, ref, out, out_ref, mb, mb_ref)


def test_without_the_same_noise_the_gradients_differ():
    """The check above is not blind to the noise: other draws give other gradients."""
    hand, ref = policy(True), policy(False)
    mb = minibatch()
    torch.manual_seed(7)
    hand.hand_gradient(mb)
    torch.manual_seed(8)
    autograd_step(ref, dict(mb))
    assert not torch.allclose(hand.model.adv_head.weight_sigma.grad, ref.model.adv_head.weight_sigma.grad, rtol=1e-3)


@pytest.mark.parametrize("hand", [True, False])
def test_an_update_draws_the_online_nets_noise_once_for_s_and_s_prime(hand):
    """Double Q with noisy heads: the online net's pass at s' (its choice of the next action) shares the
    noise of its pass at s (as in Kaixhin's Rainbow: by hand one pass of 2B rows, by autograd a pass at s'
    inside ``shared_noise``), so an update draws the noise of two forward passes, the online net's and the
    target net's, not three."""
    p = policy(hand)
    torch.manual_seed(7)
    p.hand_gradient(minibatch()) if hand else autograd_step(p, minibatch())
    after = torch.randn(4)
    torch.manual_seed(7)
    with torch.no_grad():
        p.model(torch.zeros(1, 3, 2))
        p.state.target_model(torch.zeros(1, 3, 2))
    assert torch.equal(after, torch.randn(4))
    torch.manual_seed(7)
    with torch.no_grad():
        for net in (p.model, p.model, p.state.target_model):  # three passes' draws would end elsewhere
            net(torch.zeros(1, 3, 2))
    assert not torch.equal(after, torch.randn(4))


def test_a_rainbow_iteration_learns_the_same_with_the_hand_gradient_and_with_autograd():
    """One learn call with prioritized replay (64 Adam steps, each minibatch drawn after the last one's
    priorities were updated from its cross-entropies), noisy dueling heads, double Q: the losses and
    the weights after it agree to float rounding."""
    hand, ref = policy(True, prioritized=True), policy(False, prioritized=True)
    rng, n = np.random.default_rng(0), 1024
    rows = SB({SB.OBS: rng.standard_normal((n, 3, 2)).astype(np.float32), SB.ACTIONS: rng.integers(0, 3, n),
               SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 3, 2)).astype(np.float32),
               SB.NSTEP_REWARDS: rng.standard_normal(n).astype(np.float32),
               SB.NSTEP_DISCOUNT: np.full(n, 0.97, np.float32)})
    learn, stats = get_algorithm("dqn").learn, []
    for p in (hand, ref):
        torch.manual_seed(3)
        stats.append(learn(p, rows, LearnContext(n, 0)))
    assert stats[0]["train/num_sgd_steps"] == stats[1]["train/num_sgd_steps"] == 64
    for k in ("train/loss/td", "train/q_mean", "train/target_mean", "train/grad_norm"):
        assert stats[0][k] == pytest.approx(stats[1][k], rel=1e-3), k
    for p, q in zip(hand.model.parameters(), ref.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    assert not torch.equal(hand.model.adv_head.weight, policy(True).model.adv_head.weight)  # it did learn
    priorities = [p.state.replay.tree.leaves(n) for p in (hand, ref)]
    assert np.allclose(*priorities, rtol=1e-3) and len(np.unique(priorities[0])) > 64  # updated alike


@pytest.mark.parametrize("training", [True, False])
def test_its_q_values_equal_the_models_in_training_and_in_eval_mode(training):
    """Eval mode: the noisy heads' means (no noise drawn); training mode: the same noise as a forward pass."""
    p = policy(True)
    net, model = C51Grad(p.model), p.model.train(training)
    x = 2 * torch.randn(300, 3, 2)
    torch.manual_seed(5)
    q = net.q_values(x, net.head())
    after = torch.randn(1)
    torch.manual_seed(5)
    with torch.no_grad():
        torch.testing.assert_close(q, model(x).dist_inputs, rtol=1e-5, atol=1e-5)
    assert torch.equal(after, torch.randn(1))  # as many draws from the generator as the model's pass
    assert training or torch.equal(q, net.q_values(x, net.head()))


@pytest.mark.parametrize("model", [{"activation": "elu"}, {"num_atoms": 1}])
def test_models_it_does_not_cover_learn_by_autograd(model):
    p = policy(True, **model)
    assert p.hand_gradient is None and not C51Grad.supports(p.model)
    assert policy(False).hand_gradient is None


def test_a_loss_of_ones_own_learns_by_autograd_even_with_atoms():
    def my_ce(policy, model, dist_class, batch):
        return LossOutput(model.q_log_probs(batch[SB.OBS]).pow(2).mean())

    a = DQNConfig(learning_starts=0)
    p = make_policy("dqn", OBS, ACT, model_config=QMLPConfig(num_atoms=11), algo_config=a, loss_fn=my_ce)
    assert p.hand_gradient is None


def test_a_non_finite_loss_stops_before_the_step_and_leaves_the_weights():
    assert_a_nan_reward_leaves_the_weights(policy(True), minibatch())
    assert_a_nan_reward_leaves_the_weights(policy(False), minibatch())  # the projection indexes no NaN


def test_the_projection_keeps_the_mass_and_puts_it_between_the_two_nearest_atoms():
    """Against a direct statement of C51's projection: each shifted atom's mass goes to the atoms on
    either side of it in proportion to closeness (all of it to an atom it lands on)."""
    support = torch.linspace(-5, 5, 11)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 11, generator=g), -1)
    rewards, discounts = minibatch()[SB.NSTEP_REWARDS], minibatch()[SB.NSTEP_DISCOUNT]
    out = project_distribution(probs, rewards, discounts, support)
    tz = (rewards[:, None] + discounts[:, None] * support).clamp(-5, 5)
    closeness = (1 - (tz[:, :, None] - support).abs()).clamp(min=0)  # [B, shifted atom, atom]
    torch.testing.assert_close(out, (probs[:, :, None] * closeness).sum(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.sum(-1), torch.ones(64))
