"""The hand-derived SAC gradient of the built-in twin_q_mlp (rlrun/models/twin_q_grad.py) against
autograd's: the same losses, statistics and parameter gradients (actor, critics, temperature) for every
option it covers; autograd for what it does not cover; the same learning over a SAC iteration."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.algos.sac import SACConfig
from rlrun.data.batch import SampleBatch as SB
from rlrun.models.twin_q import TwinQConfig, TwinQModel
from rlrun.models.twin_q_grad import TwinQGrad
from rlrun.policy.policy import LossOutput, Policy
from rlrun.sources.plugins import load_builtins
from tests.conftest import assert_a_nan_reward_leaves_the_weights

load_builtins()
OBS, ACT = gym.spaces.Box(-np.inf, np.inf, (3, 2), np.float32), gym.spaces.Box(-2.0, 3.0, (3,), np.float32)


def policy(hand: bool, *, activation: str = "relu", alpha: float | None = None, num_critics: int = 2,
           hiddens: tuple[list[int], list[int]] = ([32, 24], [40, 16]), seed: int = 0, compile_update: bool = False
           ) -> Policy:
    m = TwinQConfig(hiddens=hiddens[0], critic_hiddens=hiddens[1], activation=activation, num_critics=num_critics)
    a = SACConfig(hand_gradient=hand, alpha=alpha, learning_starts=0, initial_alpha=0.5, train_batch_size=64,
                  sgd_minibatch_size=64, training_intensity=64.0, compile_update=compile_update)  # one update a row
    p = make_policy("sac", OBS, ACT, model_config=m, algo_config=a, seed=seed)
    with torch.no_grad():
        for t in p.state.target_model.critics.parameters():  # target critics other than the critics
            t.add_(0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel())))
        # log-stds around both clamp limits, so rows on either side of them occur
        p.model.head.bias[3:] = torch.tensor([2.2, -1.0, 0.0])
        p.model.head.weight[3] *= 20.0
    return p


def minibatch(n: int = 64, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {SB.OBS: 2 * torch.randn(n, 3, 2, generator=g), SB.ACTIONS: 5 * torch.rand(n, 3, generator=g) - 2,
            SB.NSTEP_NEXT_OBS: 2 * torch.randn(n, 3, 2, generator=g), SB.NSTEP_REWARDS: torch.randn(n, generator=g),
            SB.NSTEP_DISCOUNT: torch.full((n,), 0.97)}


def parameters(p: Policy) -> list[torch.Tensor]:
    return [*p.model.parameters(), p.state.log_alpha]


CASES = list(itertools.product(["relu", "tanh"], [None, 0.2], [2, 1], [([32, 24], [40, 16]), ([16], [24])]))


@pytest.mark.parametrize(("activation", "alpha", "num_critics", "hiddens"), CASES)
def test_the_hand_gradient_equals_autograds(activation, alpha, num_critics, hiddens):
    """Each stage's hand-derived gradient against autograd's of the same stage, on the same weights and
    the same noise draws (no step between the stages here)."""
    assert_the_hand_stages_equal_autograds(policy(True, activation=activation, alpha=alpha, num_critics=num_critics,
                                                  hiddens=hiddens))


def assert_the_hand_stages_equal_autograds(p: Policy, rtol: float = 2e-5, atol: float = 1e-6) -> None:
    """``p``'s hand-derived stages against autograd's of the same stages, on the same weights and noise draws
    (the gradients to ``rtol`` and ``atol``)."""
    assert isinstance(p.hand_gradient, tuple) and len(p.hand_gradient) == len(p.stages) == 2
    mb = minibatch()
    start = p.generator.get_state()
    outs, hand = [], []
    for fn in p.hand_gradient:
        for t in parameters(p):
            t.grad = None
        outs.append(fn(dict(mb)))
        hand.append([None if t.grad is None else t.grad.clone() for t in parameters(p)])
    p.generator.set_state(start)  # the same noise draws, in the same order
    for (loss_fn, _, _), out, grads in zip(p.stages, outs, hand, strict=True):
        for t in parameters(p):
            t.grad = None
        ref = loss_fn(p, p.model, p.dist_class, dict(mb))
        ref.total.backward()
        assert float(out.total) == pytest.approx(float(ref.total.detach()), rel=1e-5)
        assert set(out.terms) == set(ref.terms) and set(out.stats) == set(ref.stats)
        for k in out.terms:
            assert float(out.terms[k]) == pytest.approx(float(ref.terms[k].detach()), rel=1e-5, abs=1e-6), k
        for k in out.stats:
            assert float(out.stats[k]) == pytest.approx(float(ref.stats[k].detach()), rel=1e-5, abs=1e-6), k
        for t, h in zip(parameters(p), grads, strict=True):
            if t.grad is None:  # a parameter this stage does not reach (or a fixed temperature)
                assert h is None or not h.any()
                continue
            assert h is not None
            torch.testing.assert_close(h, t.grad, rtol=rtol, atol=atol)
    assert {k for o in outs for k in o.terms} == {"critic", "actor", "alpha"}
    clamped = p.model(mb[SB.OBS]).dist_inputs[:, 3:].detach()
    assert (clamped > 2.0).any() and (clamped < 2.0).any()  # the log-std clamp's both sides were exercised


def test_a_sac_iteration_learns_the_same_with_the_hand_gradient_and_with_autograd():
    """One learn call (1,024 updates on replayed minibatches: three Adam groups and the Polyak step):
    the losses and the weights after it agree to float rounding."""
    assert_a_learn_call_agrees(policy(True), policy(False), 1024)


SAC_STATS = ("train/loss/critic", "train/loss/actor", "train/loss/alpha", "train/q_mean", "train/entropy")


def assert_a_learn_call_agrees(a: Policy, b: Policy, n: int, algo: str = "sac", keys: tuple[str, ...] = SAC_STATS
                               ) -> None:
    """One ``algo`` learn call of ``n`` stored rows (one update a row) on each of two policies with the same weights:
    the statistics ``keys``, the weights and the target networks after it agree to float rounding, and the weights
    moved."""
    rng = np.random.default_rng(0)
    rows = SB({SB.OBS: rng.standard_normal((n, 3, 2)).astype(np.float32),
               SB.ACTIONS: rng.uniform(-2, 3, (n, 3)).astype(np.float32),
               SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 3, 2)).astype(np.float32),
               SB.NSTEP_REWARDS: rng.standard_normal(n).astype(np.float32),
               SB.NSTEP_DISCOUNT: np.full(n, 0.97, np.float32)})
    before = a.model.head.weight.clone()
    learn = get_algorithm(algo).learn
    stats = [learn(p, rows, LearnContext(n, 0)) for p in (a, b)]
    assert stats[0]["train/num_sgd_steps"] == stats[1]["train/num_sgd_steps"] == n
    for k in keys:
        assert stats[0][k] == pytest.approx(stats[1][k], rel=1e-3, abs=1e-4), k
    for p, q in zip(parameters(a), parameters(b), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    for p, q in zip(a.state.target_model.parameters(), b.state.target_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    assert not torch.equal(a.model.head.weight, before)  # it did learn


def test_models_and_losses_it_does_not_cover_learn_by_autograd():
    assert policy(False).hand_gradient is None
    p = policy(True, activation="elu")
    assert p.hand_gradient is None and not TwinQGrad.supports(p.model, p.state.target_model)

    class MyTwinQ(TwinQModel):
        pass

    q = policy(True)
    assert not TwinQGrad.supports(MyTwinQ(OBS, ACT, 6, TwinQConfig()), q.state.target_model)

    def my_sac(policy, model, dist_class, batch):
        return LossOutput(model(batch[SB.OBS]).dist_inputs.pow(2).mean())

    a = SACConfig(learning_starts=0)
    assert make_policy("sac", OBS, ACT, model_config=TwinQConfig(), algo_config=a, loss_fn=my_sac).hand_gradient is None


def test_a_non_finite_loss_stops_before_the_step_and_leaves_the_weights():
    assert_a_nan_reward_leaves_the_weights(policy(True), minibatch())
