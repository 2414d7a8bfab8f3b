"""Off-policy estimators: the value of a target policy pi from episodes a behaviour policy mu recorded.

Every estimator works on whole episodes and returns one estimate per episode; ``summarize`` turns
those into the mean and a normal 95% confidence interval. With p_t = prod_{k<=t} pi(a_k|s_k) / mu(a_k|s_k):

- ``is``  (per-decision importance sampling): sum_t gamma^t p_t r_t
- ``wis`` (weighted per-decision IS): sum_t gamma^t p_t / w_t r_t, w_t the mean of p_t over all
  episodes, an episode that has ended keeping its last p (it sits in an absorbing state where both
  policies agree). Normalising only over the episodes still running at t would turn any constant
  reward, such as CartPole's, into exactly the behaviour policy's value.
- ``dm``  (direct method): V(s_0) = sum_a pi(a|s_0) Q(s_0, a) with a fitted Q (``fqe``)
- ``dr``  (doubly robust, Jiang & Li 2016): backwards, V_DR(t) = V(s_t) + rho_t (r_t + gamma V_DR(t+1) - Q(s_t, a_t))
- ``wdr`` (weighted doubly robust, Thomas & Brunskill 2016): sum_t gamma^t [w_t (r_t - Q(s_t, a_t)) + w_{t-1} V(s_t)]
  with WIS's normalised weights w_t = p_t / mean(p_t) (w_{-1} = 1). The fitted Q is a control variate
  for WIS: it keeps WIS's bounded weights where ``dr``'s raw ratio products blow up on long episodes.

``v_behavior`` is the discounted return the data itself got; ``v_gain`` = v_target / v_behavior (RLlib's
definition: above 1, the target policy is estimated to do better than the one that recorded the data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

NEEDS_Q = ("dm", "dr", "wdr")


class Episode(NamedTuple):
    """One recorded episode and what the estimators need of it (arrays of length T)."""

    rewards: np.ndarray
    behavior_prob: np.ndarray  # mu(a_t | s_t), as recorded
    target_prob: np.ndarray  # pi(a_t | s_t)
    q_taken: np.ndarray | None = None  # Q(s_t, a_t) under pi (dm, dr)
    v: np.ndarray | None = None  # V(s_t) = sum_a pi(a|s_t) Q(s_t, a) (dm, dr)


class Estimate(NamedTuple):
    v_target: float
    v_behavior: float
    v_gain: float
    v_target_ci_low: float  # normal 95% interval of the mean over episodes
    v_target_ci_high: float

    def metrics(self, method: str) -> dict[str, float]:
        return {f"ope/{method}/{k}": float(v) for k, v in self._asdict().items()}


def discounted(rewards: np.ndarray, gamma: float) -> float:
    return float(np.sum(rewards * gamma ** np.arange(len(rewards))))


def _cumulative_ratio(ep: Episode) -> np.ndarray:
    return np.cumprod(ep.target_prob.astype(np.float64) / ep.behavior_prob.astype(np.float64))


def importance_sampling(episodes: Sequence[Episode], gamma: float) -> np.ndarray:
    out = []
    for ep in episodes:
        p = _cumulative_ratio(ep)
        out.append(np.sum(gamma ** np.arange(len(p)) * p * ep.rewards))
    return np.asarray(out, dtype=np.float64)


def _normalised_ratios(episodes: Sequence[Episode]) -> list[np.ndarray]:
    """p_t / mean over episodes of p_t, an episode that has ended keeping its last p (per episode)."""
    ratios = [_cumulative_ratio(ep) for ep in episodes]
    horizon = max(len(p) for p in ratios)
    total = np.zeros(horizon)
    for p in ratios:
        total[: len(p)] += p
        total[len(p):] += p[-1]  # ended: the ratio stays where it was
    w = total / len(ratios)
    return [np.divide(p, w[: len(p)], out=np.zeros_like(p), where=w[: len(p)] > 0) for p in ratios]


def weighted_importance_sampling(episodes: Sequence[Episode], gamma: float) -> np.ndarray:
    return np.asarray([np.sum(gamma ** np.arange(len(w)) * w * ep.rewards)
                       for ep, w in zip(episodes, _normalised_ratios(episodes), strict=True)], dtype=np.float64)


def direct_method(episodes: Sequence[Episode], gamma: float) -> np.ndarray:
    return np.asarray([float(_need(ep.v)[0]) for ep in episodes], dtype=np.float64)


def doubly_robust(episodes: Sequence[Episode], gamma: float) -> np.ndarray:
    out = []
    for ep in episodes:
        rho = ep.target_prob.astype(np.float64) / ep.behavior_prob.astype(np.float64)
        q, v = _need(ep.q_taken), _need(ep.v)
        value = 0.0
        for t in range(len(rho) - 1, -1, -1):
            value = v[t] + rho[t] * (ep.rewards[t] + gamma * value - q[t])
        out.append(value)
    return np.asarray(out, dtype=np.float64)


def weighted_doubly_robust(episodes: Sequence[Episode], gamma: float) -> np.ndarray:
    out = []
    for ep, w in zip(episodes, _normalised_ratios(episodes), strict=True):
        q, v = _need(ep.q_taken), _need(ep.v)
        w_before = np.concatenate([[1.0], w[:-1]])
        out.append(np.sum(gamma ** np.arange(len(w)) * (w * (ep.rewards - q) + w_before * v)))
    return np.asarray(out, dtype=np.float64)


def _need(a: np.ndarray | None) -> np.ndarray:
    if a is None:
        raise ValueError("this estimator needs Q and V values (a fitted Q function)")
    return a


ESTIMATORS = {"is": importance_sampling, "wis": weighted_importance_sampling, "dm": direct_method,
              "dr": doubly_robust, "wdr": weighted_doubly_robust}


def summarize(per_episode: np.ndarray, episodes: Sequence[Episode], gamma: float) -> Estimate:
    behavior = float(np.mean([discounted(ep.rewards, gamma) for ep in episodes]))
    mean = float(np.mean(per_episode))
    half = 1.96 * float(np.std(per_episode, ddof=1)) / np.sqrt(len(per_episode)) if len(per_episode) > 1 else 0.0
    gain = mean / behavior if behavior != 0 else float("nan")
    return Estimate(mean, behavior, gain, mean - half, mean + half)


def estimate(method: str, episodes: Sequence[Episode], gamma: float) -> Estimate:
    return summarize(ESTIMATORS[method](episodes, gamma), episodes, gamma)
