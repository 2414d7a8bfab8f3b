"""The hand-derived TD3 gradient of the built-in twin_q_mlp (rlrun/models/td3_grad.py) against autograd's:
the same losses, statistics and parameter gradients (critics, then the actor) for every option it covers,
autograd for what it does not cover, and the same learning over a TD3 iteration."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlrun.algos.algorithm import make_policy
from rlrun.algos.td3 import TD3Config, TD3LossConfig, td3_loss
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.td3_grad import TD3Grad
from rlrun.models.twin_q import TwinQConfig
from rlrun.policy.policy import Policy
from tests.conftest import assert_a_nan_reward_leaves_the_weights
from tests.test_twin_q_grad import ACT, OBS, assert_a_learn_call_agrees, minibatch


def policy(hand: bool, *, activation: str = "relu", num_critics: int = 2, target_noise: float = 0.2,
           hiddens: tuple[list[int], list[int]] = ([32, 24], [40, 16]), seed: int = 0, **loss: float) -> Policy:
    m = TwinQConfig(hiddens=hiddens[0], critic_hiddens=hiddens[1], activation=activation, num_critics=num_critics,
                    action_dist="deterministic")
    a = TD3Config(hand_gradient=hand, target_noise=target_noise, learning_starts=0, train_batch_size=64,
                  sgd_minibatch_size=64, training_intensity=64.0)  # one update a row
    p = make_policy("td3", OBS, ACT, model_config=m, algo_config=a, loss_config=TD3LossConfig(**loss), seed=seed)
    with torch.no_grad():  # target networks other than the online ones, actions near the tanh's saturation too
        for t in p.state.target_model.parameters():
            t.add_(0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel())))
        p.model.head.weight[0] *= 20.0
    return p


CASES = list(itertools.product(["relu", "tanh"], [2, 1], [0.2, 0.0], [([32, 24], [40, 16]), ([16], [24])]))


@pytest.mark.parametrize(("activation", "num_critics", "target_noise", "hiddens"), CASES)
def test_the_hand_gradient_equals_autograds(activation, num_critics, target_noise, hiddens):
    """Each stage's loss, statistics and gradients by hand against autograd's of the same stage, on the same
    weights and the same smoothing noise draw."""
    assert_the_hand_gradient_equals_autograds(
        policy(True, activation=activation, num_critics=num_critics, target_noise=target_noise, hiddens=hiddens))


def assert_the_hand_gradient_equals_autograds(p: Policy, rtol: float = 2e-5, atol: float = 1e-6) -> None:
    """``p``'s hand-derived stages against autograd's of the same stages, on the same weights and smoothing noise
    (the gradients to ``rtol`` and ``atol``)."""
    assert isinstance(p.hand_gradient, tuple) and len(p.hand_gradient) == len(p.stages) == 2
    mb = minibatch()
    start = p.generator.get_state()
    outs, hand = [], []
    for fn in p.hand_gradient:
        for t in p.model.parameters():
            t.grad = None
        outs.append(fn(dict(mb)))
        hand.append([None if t.grad is None else t.grad.clone() for t in p.model.parameters()])
    p.generator.set_state(start)  # the same smoothing noise
    for stage, out, grads in zip(td3_loss.stages, outs, hand, strict=True):
        for t in p.model.parameters():
            t.grad = None
        ref = stage.loss_fn(p, p.model, p.dist_class, dict(mb))
        ref.total.backward()
        assert float(out.total) == pytest.approx(float(ref.total.detach()), rel=1e-5)
        assert set(out.terms) == set(ref.terms) and set(out.stats) == set(ref.stats)
        for k in out.stats:
            assert float(out.stats[k]) == pytest.approx(float(ref.stats[k].detach()), rel=1e-5, abs=1e-6), k
        for t, h in zip(p.model.parameters(), grads, strict=True):
            if t.grad is None:  # a parameter this stage does not reach
                assert h is None or not h.any()
                continue
            assert h is not None
            torch.testing.assert_close(h, t.grad, rtol=rtol, atol=atol)
    a = torch.tanh(p.model(mb[SB.OBS]).dist_inputs)
    assert (a.abs() > 0.999).any() and (a.abs() < 0.5).any()  # saturated and unsaturated actions both occur


def test_a_td3_iteration_learns_the_same_with_the_hand_gradient_and_with_autograd():
    """One learn call (512 updates, the actor and the targets on every second): the losses, the weights and the
    target networks after it agree to float rounding, and the weights moved."""
    a, b = policy(True), policy(False)
    assert a.hand_gradient is not None and b.hand_gradient is None
    assert_a_learn_call_agrees(a, b, 512, "td3", ("train/loss/critic", "train/q_mean", "train/target_mean"))


def test_what_it_does_not_derive_learns_by_autograd():
    assert policy(False).hand_gradient is None
    assert policy(True, activation="elu").hand_gradient is None
    assert policy(True, huber_delta=1.0).hand_gradient is None  # RLlib DDPG's Huber critic
    assert policy(True, l2_reg=0.01).hand_gradient is None  # and its l2_reg
    p = policy(True)
    assert TD3Grad.supports(p.model, p.state.target_model)

    def my_td3(policy, model, dist_class, batch):
        return td3_loss(policy, model, dist_class, batch)

    a = TD3Config(learning_starts=0)
    m = TwinQConfig(action_dist="deterministic")
    assert make_policy("td3", OBS, ACT, model_config=m, algo_config=a, loss_fn=my_td3).hand_gradient is None


def test_a_non_finite_loss_stops_before_the_step_and_leaves_the_weights():
    assert_a_nan_reward_leaves_the_weights(policy(True), minibatch())
