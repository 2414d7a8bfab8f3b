import numpy as np
import pytest

from rlrun.data.postprocessing import compute_gae, discounted_returns, explained_variance

F = np.float32


def test_gae_matches_hand_computed_single_episode_terminated():
    r = np.array([1.0, 1.0, 1.0], F)
    v = np.array([0.5, 0.4, 0.3], F)
    nv = np.array([0.4, 0.3, 99.0], F)  # last next value must be ignored: terminated
    term = np.array([False, False, True])
    ends = term.copy()
    g, lam = 0.9, 0.8
    res = compute_gae(r, v, nv, term, ends, g, lam)
    d2 = 1.0 - 0.3
    d1 = 1.0 + g * 0.3 - 0.4
    d0 = 1.0 + g * 0.4 - 0.5
    a2 = d2
    a1 = d1 + g * lam * a2
    a0 = d0 + g * lam * a1
    np.testing.assert_allclose(res.advantages, [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(res.value_targets, np.array([a0, a1, a2]) + v, rtol=1e-6)


def test_gae_truncation_bootstraps_and_stops_recursion():
    # episode A: 2 steps truncated (bootstrap 5.0); episode B: 1 step cut by the fragment (bootstrap 2.0)
    r = np.array([1.0, 2.0, 3.0], F)
    v = np.array([0.0, 0.0, 0.0], F)
    nv = np.array([0.0, 5.0, 2.0], F)
    term = np.zeros(3, bool)
    ends = np.array([False, True, True])
    g = 0.5
    res = compute_gae(r, v, nv, term, ends, g, 1.0)
    # A: G1 = 2 + 0.5*5 = 4.5 ; G0 = 1 + 0.5*4.5 = 3.25 ; B: G2 = 3 + 0.5*2 = 4
    np.testing.assert_allclose(res.advantages, [3.25, 4.5, 4.0])


def test_gae_terminated_never_bootstraps():
    r = np.array([1.0], F)
    res = compute_gae(r, np.zeros(1, F), np.array([100.0], F), np.array([True]), np.array([True]), 0.99, 0.95)
    assert res.advantages[0] == pytest.approx(1.0)


def test_gae_two_dimensional_equals_per_column():
    rng = np.random.default_rng(0)
    T, B = 7, 3
    r = rng.normal(size=(T, B)).astype(F)
    v = rng.normal(size=(T, B)).astype(F)
    nv = rng.normal(size=(T, B)).astype(F)
    term = rng.random((T, B)) < 0.2
    ends = term | (rng.random((T, B)) < 0.2)
    ends[-1] = True
    full = compute_gae(r, v, nv, term, ends, 0.97, 0.9).advantages
    for b in range(B):
        col = compute_gae(r[:, b], v[:, b], nv[:, b], term[:, b], ends[:, b], 0.97, 0.9).advantages
        np.testing.assert_allclose(full[:, b], col, rtol=1e-5)


def test_gae_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="values has shape"):
        compute_gae(np.zeros(3, F), np.zeros(2, F), np.zeros(3, F), np.zeros(3, bool), np.zeros(3, bool), 1, 1)


def test_discounted_returns_restart_at_episode_ends():
    r = np.array([1.0, 1.0, 1.0, 1.0], F)
    ends = np.array([False, True, False, True])
    np.testing.assert_allclose(discounted_returns(r, ends, 0.5), [1.5, 1.0, 1.5, 1.0])
    boot = np.array([0, 0, 0, 4.0], F)
    np.testing.assert_allclose(discounted_returns(r, ends, 0.5, boot), [1.5, 1.0, 2.5, 3.0])


def test_explained_variance():
    y = np.array([1.0, 2.0, 3.0])
    assert explained_variance(y, y) == pytest.approx(1.0)
    assert explained_variance(np.full(3, 2.0), y) == pytest.approx(0.0)


def _vtrace_reference(mu, pi, r, v, nv, term, ends, gamma, rho_bar_clip, c_clip):
    """The paper's definition, literally: vs_t = V_t + sum_{s>=t} gamma^{s-t} (prod_{i<s} c_i) delta_s,
    summed within each segment, O(T^2)."""
    T = len(r)
    rho = np.exp(pi - mu)
    rb = np.minimum(rho_bar_clip, rho)
    c = np.minimum(c_clip, rho)
    delta = rb * (r + gamma * nv * (1 - term) - v)
    vs = np.zeros(T)
    for t in range(T):
        total, prod = 0.0, 1.0
        for s in range(t, T):
            total += gamma ** (s - t) * prod * delta[s]
            if ends[s]:
                break
            prod *= c[s]
        vs[t] = v[t] + total
    vs_next = np.array([nv[t] if ends[t] else vs[t + 1] for t in range(T)])
    adv = rb * (r + gamma * (1 - term) * vs_next - v)
    return vs, adv


def test_vtrace_matches_slow_reference_loop():
    from rlrun.data.postprocessing import vtrace

    rng = np.random.default_rng(3)
    T = 12
    mu = np.log(rng.uniform(0.1, 0.9, T))
    pi = np.log(rng.uniform(0.1, 0.9, T))
    r = rng.normal(size=T)
    v = rng.normal(size=T)
    nv = np.r_[v[1:], rng.normal()]
    term = np.zeros(T, bool)
    term[4] = True
    ends = term.copy()
    ends[8] = True  # a truncation
    ends[-1] = True  # the segment cut
    nv[8] = 5.0  # bootstrap value of the truncated episode's final observation
    res = vtrace(mu, pi, r, v, nv, term, ends, gamma=0.9, clip_rho=1.0, clip_c=1.0)
    ref_vs, ref_adv = _vtrace_reference(mu, pi, r, v, nv, term, ends, 0.9, 1.0, 1.0)
    np.testing.assert_allclose(res.vs, ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.pg_advantages, ref_adv, rtol=1e-5, atol=1e-5)


def test_vtrace_on_policy_equals_n_step_returns():
    from rlrun.data.postprocessing import vtrace

    r = np.array([1.0, 1.0, 1.0], np.float32)
    v = np.zeros(3, np.float32)
    nv = np.array([0.0, 0.0, 2.0], np.float32)
    ends = np.array([False, False, True])
    logp = np.log(np.full(3, 0.5))
    res = vtrace(logp, logp, r, v, nv, np.zeros(3, bool), ends, gamma=0.5)
    # on-policy, lambda = 1: vs = discounted return bootstrapped with 2.0 at the cut
    np.testing.assert_allclose(res.vs, [1 + 0.5 + 0.25 + 0.125 * 2, 1 + 0.5 + 0.25 * 2, 1 + 0.5 * 2], rtol=1e-6)
