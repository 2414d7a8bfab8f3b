"""Off-policy estimators (rlrun/data/estimators.py, rlrun/training/ope.py): each one on small,
hand-computed examples; FQE on a bandit; the on-policy case on recorded CartPole data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlrun.data.batch import SampleBatch as SB
from rlrun.data.estimators import Episode, estimate
from rlrun.training.ope import fit_fqe, q_values

# a one-step bandit: action 0 pays 1, action 1 pays 0; behaviour mu = (0.5, 0.5), target pi = (0.8, 0.2)
MU, PI = np.array([0.5, 0.5]), np.array([0.8, 0.2])


def bandit(actions, q=(1.0, 0.0)):
    q = np.asarray(q)
    return [Episode(np.array([1.0 - a]), MU[[a]], PI[[a]], q[[a]], np.array([PI @ q])) for a in actions]


def test_every_estimator_is_exact_on_the_bandit_with_the_true_q():
    eps = bandit([0, 1])
    for method in ("is", "wis", "dm", "dr", "wdr"):
        e = estimate(method, eps, gamma=0.9)
        assert e.v_target == pytest.approx(0.8), method  # the true value: pi(0) x 1
        assert e.v_behavior == pytest.approx(0.5) and e.v_gain == pytest.approx(1.6)
    assert estimate("is", eps, 0.9).v_target_ci_high > 0.8 > estimate("is", eps, 0.9).v_target_ci_low
    dr = estimate("dr", eps, 0.9)
    assert dr.v_target_ci_low == pytest.approx(dr.v_target_ci_high)  # exact Q: no variance left


def test_dm_is_biased_by_a_wrong_q_and_dr_corrects_it():
    eps = bandit([0, 1], q=(0.5, 0.5))
    assert estimate("dm", eps, 0.9).v_target == pytest.approx(0.5)
    # DR: 0.5 + 1.6 (1 - 0.5) = 1.3 and 0.5 + 0.4 (0 - 0.5) = 0.3, mean 0.8
    assert estimate("dr", eps, 0.9).v_target == pytest.approx(0.8)


def test_per_decision_is_and_wis_over_two_steps_by_hand():
    """Two 2-step episodes, gamma 0.5: one takes action 0 twice (rewards 1, 1), one action 1 twice
    (rewards 0, 0). Ratios 1.6 and 0.4 per step."""
    good = Episode(np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([0.8, 0.8]))
    bad = Episode(np.array([0.0, 0.0]), np.array([0.5, 0.5]), np.array([0.2, 0.2]))
    # IS: 1.6 x 1 + 0.5 x 2.56 x 1 = 2.88 for the good one, 0 for the other
    assert estimate("is", [good, bad], 0.5).v_target == pytest.approx(2.88 / 2)
    # WIS: w_0 = (1.6 + 0.4) / 2 = 1, w_1 = (2.56 + 0.16) / 2 = 1.36
    assert estimate("wis", [good, bad], 0.5).v_target == pytest.approx((1.6 + 0.5 * 2.56 / 1.36) / 2)
    assert estimate("is", [good, bad], 0.5).v_behavior == pytest.approx((1 + 0.5) / 2)


def test_wis_counts_ended_episodes_with_their_last_ratio():
    """Reward 1 per step, gamma 1: the target keeps the long episode's actions (ratio 1.6 per step),
    avoids the short one's (0.4). Episode A: 2 steps; episode B: 1 step. p_A = 1.6, 2.56; p_B = 0.4.
    w_0 = (1.6 + 0.4) / 2 = 1; w_1 = (2.56 + 0.4) / 2 = 1.48 (B ended, keeps 0.4).
    A: 1.6 / 1 + 2.56 / 1.48; B: 0.4 / 1. The estimate moves toward the target's longer episodes,
    away from the behaviour value 1.5 (which normalising over running episodes only would return)."""
    a = Episode(np.ones(2), np.array([0.5, 0.5]), np.array([0.8, 0.8]))
    b = Episode(np.ones(1), np.array([0.5]), np.array([0.2]))
    e = estimate("wis", [a, b], 1.0)
    assert e.v_target == pytest.approx((1.6 + 2.56 / 1.48 + 0.4) / 2)
    assert e.v_behavior == pytest.approx(1.5) and e.v_target > e.v_behavior


def test_weighted_dr_by_hand_and_its_reductions():
    """The two 2-step episodes above with a fitted Q: WDR = sum_t gamma^t [w_t (r_t - Q_t) + w_{t-1} V_t],
    w_t the WIS weights p_t / mean(p_t), w_{-1} = 1. With Q = V = 0 it is WIS; a constant Q = V
    (any baseline the target agrees with) leaves it unchanged."""
    mu, pi = np.array([0.5, 0.5]), np.array([0.8, 0.8])

    def two(q_good, v_good, q_bad, v_bad):
        return [Episode(np.array([1.0, 1.0]), mu, pi, np.array(q_good), np.array(v_good)),
                Episode(np.array([0.0, 0.0]), mu, 1 - pi, np.array(q_bad), np.array(v_bad))]

    zero = two([0, 0], [0, 0], [0, 0], [0, 0])
    assert estimate("wdr", zero, 0.5).v_target == pytest.approx(estimate("wis", zero, 0.5).v_target)
    const = two([3, 3], [3, 3], [3, 3], [3, 3])
    assert estimate("wdr", const, 0.5).v_target == pytest.approx(estimate("wis", zero, 0.5).v_target)
    eps = two([1.5, 1.0], [1.2, 0.8], [0.0, 0.0], [1.2, 0.8])
    w_good, w_bad = (1.6, 2.56 / 1.36), (0.4, 0.16 / 1.36)
    good = w_good[0] * (1 - 1.5) + 1.2 + 0.5 * (w_good[1] * (1 - 1.0) + w_good[0] * 0.8)
    bad = w_bad[0] * 0 + 1.2 + 0.5 * (w_bad[1] * 0 + w_bad[0] * 0.8)
    assert estimate("wdr", eps, 0.5).v_target == pytest.approx((good + bad) / 2)


def test_fqe_recovers_the_bandits_q_values():
    n = 2000
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, n)
    data = SB({SB.OBS: np.zeros((n, 1), np.float32), SB.NEXT_OBS: np.zeros((n, 1), np.float32), SB.ACTIONS: actions,
               SB.REWARDS: (1.0 - actions).astype(np.float32), SB.TERMINATEDS: np.ones(n, bool)})
    q = q_values(fit_fqe(data, np.tile(PI, (n, 1)), 2, 0.9, steps=500, seed=0), np.zeros((1, 1), np.float32))[0]
    assert q == pytest.approx([1.0, 0.0], abs=0.05)


def test_fqe_bootstraps_through_a_chain():
    """A 3-state chain (s0 -> s1 -> s2, terminal after s2), reward 1 per step, gamma 0.5: Q(s0) = 1.75."""
    obs = np.eye(3, dtype=np.float32)
    nxt = np.roll(obs, -1, axis=0)
    n = 300
    data = SB({SB.OBS: np.tile(obs, (n, 1)), SB.NEXT_OBS: np.tile(nxt, (n, 1)), SB.ACTIONS: np.zeros(3 * n, np.int64),
               SB.REWARDS: np.ones(3 * n, np.float32), SB.TERMINATEDS: np.tile([False, False, True], n)})
    q = q_values(fit_fqe(data, np.tile([1.0, 0.0], (3 * n, 1)), 2, 0.5, steps=1500, seed=0), obs)[:, 0]
    assert q == pytest.approx([1.75, 1.5, 1.0], abs=0.05)


@pytest.mark.slow
def test_on_policy_estimates_match_the_data_and_a_run_logs_them(recorded, tmp_path):
    """Estimating the policy that recorded the data: IS and WIS equal the data's own discounted
    return exactly; DR and WDR within 1%; a BC run reports every ope/<method>/* metric."""
    from rlrun.app.cli import compose
    from rlrun.app.runner import run
    from rlrun.training.export import load_policy
    from rlrun.training.ope import OffPolicyEvaluator

    behaviour = load_policy(sorted((recorded / "run" / "checkpoints").iterdir())[-1])
    cfg = compose(["+experiment=bc_cartpole", f"input={recorded / 'data'}", "tracking=none", "progress=false",
                   "offline.evaluation=[is,wis,dm,dr,wdr]", "offline.evaluation_episodes=50", "offline.fqe_steps=500",
                   "offline.evaluation_interval=2", "stop.training_iteration=2", f"output_dir={tmp_path / 'bc'}"])
    m = OffPolicyEvaluator(cfg, behaviour.action_space).evaluate(behaviour.policy)
    v = m["ope/is/v_behavior"]
    assert 90 < v < 100  # 500-step episodes, gamma 0.99: (1 - 0.99^500) / 0.01 = 99.3
    assert m["ope/is/v_target"] == pytest.approx(v, rel=1e-4) and m["ope/wis/v_target"] == pytest.approx(v, rel=1e-4)
    assert m["ope/dr/v_target"] == pytest.approx(v, rel=0.01) and m["ope/wdr/v_target"] == pytest.approx(v, rel=0.01)
    r = run(cfg, tmp_path)
    for method in ("is", "wis", "dm", "dr", "wdr"):
        for key in ("v_target", "v_behavior", "v_gain", "v_target_ci_low", "v_target_ci_high"):
            assert math.isfinite(r.metrics[f"ope/{method}/{key}"]), (method, key)
