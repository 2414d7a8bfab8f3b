"""The hand-derived TD gradient of the built-in q_mlp (rlrun/models/q_mlp_grad.py) against autograd's:
the same loss, Q-values, TD errors and parameter gradients for every option it covers; autograd for
what it does not cover; the same learning over a DQN iteration."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.algos.dqn import TARGET_Q_NEXT, DQNConfig, DQNLossConfig, replay_minibatches
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.q_mlp_grad import QMLPGrad
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


def policy(hand: bool, *, dueling: bool = True, double_q: bool = True, delta: float = 1.0,
           activation: str = "relu", seed: int = 0, **model: object) -> Policy:
    m = QMLPConfig(hiddens=[32, 16], dueling=dueling, activation=activation, **model)  # type: ignore[arg-type]
    a = DQNConfig(double_q=double_q, hand_gradient=hand, learning_starts=0, sgd_minibatch_size=64,
                  training_intensity=16.0, grad_clip=10.0, target_network_update_freq=10**9)
    return dqn_policy_with_another_target(OBS, ACT, m, a, loss_config=DQNLossConfig(huber_delta=delta), seed=seed)


def minibatch(n: int = 64, weights: bool = False, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mb = {SB.OBS: 2 * torch.randn(n, 3, 2, generator=g), SB.ACTIONS: torch.randint(0, 3, (n,), generator=g),
          SB.NSTEP_NEXT_OBS: 2 * torch.randn(n, 3, 2, generator=g), SB.NSTEP_REWARDS: torch.randn(n, generator=g),
          SB.NSTEP_DISCOUNT: torch.full((n,), 0.97)}
    if weights:
        mb[SB.WEIGHTS] = torch.rand(n, generator=g) + 0.1
    return mb



CASES = list(itertools.product([True, False], [True, False], [1.0, 0.0], [False, True], ["relu", "tanh"]))


@pytest.mark.parametrize(("dueling", "double_q", "delta", "weights", "activation"), CASES)
def test_the_hand_gradient_equals_autograds(dueling, double_q, delta, weights, activation):
    """Huber (delta 1) and squared (delta 0) losses, dueling or not, double Q or not, importance
    weights or not, ReLU or tanh: the loss, TD errors, stats and every parameter's gradient match
    autograd's to float rounding. Targets are scaled so some rows fall outside the Huber threshold."""
    hand, ref = (policy(h, dueling=dueling, double_q=double_q, delta=delta, activation=activation)
                 for h in (True, False))
    assert hand.hand_gradient is not None and ref.hand_gradient is None
    mb = minibatch(weights=weights)
    mb[SB.NSTEP_REWARDS] *= 3.0
    mb_ref = dict(mb)
    out = hand.hand_gradient(mb)
    out_ref = autograd_step(ref, mb_ref)
    outside = (mb_ref[SB.TD_ERROR].abs() > 1.0).float().mean()
    assert 0.1 < float(outside) < 0.9  # both branches of the Huber loss are exercised
    assert_the_same_dqn_step(hand, ref, out, out_ref, mb, mb_ref)


def test_a_dqn_iteration_learns_the_same_with_the_hand_gradient_and_with_autograd():
    """One learn call (the target pass in pieces, 64 Adam steps on replayed minibatches): the losses
    and the weights after it agree to float rounding."""
    hand, ref = policy(True), policy(False)
    rng, n = np.random.default_rng(0), 4096
    rows = SB({SB.OBS: rng.standard_normal((n, 3, 2)).astype(np.float32), SB.ACTIONS: rng.integers(0, 3, n),
               SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 3, 2)).astype(np.float32),
               SB.NSTEP_REWARDS: rng.standard_normal(n).astype(np.float32),
               SB.NSTEP_DISCOUNT: np.full(n, 0.97, np.float32)})
    learn = get_algorithm("dqn").learn
    stats = [learn(p, rows, LearnContext(n, 0)) for p in (hand, ref)]
    assert stats[0]["train/num_sgd_steps"] == stats[1]["train/num_sgd_steps"] == 1024
    for k in ("train/loss/td", "train/q_mean", "train/target_mean", "train/grad_norm"):
        assert stats[0][k] == pytest.approx(stats[1][k], rel=1e-3), k
    for p, q in zip(hand.model.parameters(), ref.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    assert not torch.equal(hand.model.adv_head.weight, policy(True).model.adv_head.weight)  # it did learn


def test_the_target_nets_q_values_without_autograd_equal_the_models():
    p = policy(True)
    state = p.state
    x = 2 * torch.randn(3000, 3, 2)
    assert state.target_grad is not None
    torch.testing.assert_close(state.target_grad.q_values(x), state.target_model(x).dist_inputs, rtol=1e-5, atol=1e-6)
    state.replay.add(SB({SB.OBS: x.numpy(), SB.ACTIONS: np.zeros(3000, np.int64), SB.NSTEP_NEXT_OBS: x.numpy(),
                         SB.NSTEP_REWARDS: np.zeros(3000, np.float32), SB.NSTEP_DISCOUNT: np.ones(3000, np.float32)}))
    for mb in replay_minibatches(state, 512, 4):  # pieces of 1,024 rows: a piece's buffers are reused
        torch.testing.assert_close(mb[TARGET_Q_NEXT], state.target_model(mb[SB.NSTEP_NEXT_OBS]).dist_inputs,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", [{"noisy": True}, {"activation": "elu"}])  # atoms: tests/test_c51_grad.py
def test_models_it_does_not_cover_learn_by_autograd(model):
    options = {"activation": "relu", **model}
    p = policy(True, **options)
    assert p.hand_gradient is None and not QMLPGrad.supports(p.model)
    assert policy(False).hand_gradient is None and policy(False).state.target_grad is None


def test_a_loss_of_ones_own_learns_by_autograd_even_on_q_mlp():
    def my_td(policy, model, dist_class, batch):
        return LossOutput(model(batch[SB.OBS]).dist_inputs.pow(2).mean())

    a = DQNConfig(learning_starts=0)
    p = make_policy("dqn", OBS, ACT, model_config=QMLPConfig(), algo_config=a, loss_fn=my_td)
    assert p.hand_gradient is None


def test_a_non_finite_loss_stops_before_the_step_and_leaves_the_weights():
    assert_a_nan_reward_leaves_the_weights(policy(True), minibatch())
