"""Return and advantage math as pure numpy functions, tested against hand-computed arrays.

Arrays are time-major: ``[T]`` for one sub-env or ``[T, B]`` for B sub-envs stepped together.
Episode ends keep "terminated" (the MDP ended: the next value is 0) apart from "truncated" (a time
limit cut it: the next value is V(final observation) and we bootstrap from it). A fragment cut
(the last row of a fragment, mid-episode) bootstraps exactly like a truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from rlrun.data.batch import SampleBatch as SB
from rlrun.data.batch import concat_samples


class GaeResult(NamedTuple):
    advantages: np.ndarray  # [T, ...] float32
    value_targets: np.ndarray  # [T, ...] float32, advantages + values (the critic's regression target)


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminateds: np.ndarray,
    ends: np.ndarray,
    gamma: float,
    lam: float,
) -> GaeResult:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 11-16).

    Args:
        rewards: ``[T, ...]`` reward received after the action at step t.
        values: ``[T, ...]`` V(s_t) predicted when acting.
        next_values: ``[T, ...]`` V(s_{t+1}); at a truncation or fragment cut this must be the value of
            the final observation (the bootstrap). Ignored where ``terminateds`` is set.
        terminateds: ``[T, ...]`` bool, the episode ended in a terminal state after step t.
        ends: ``[T, ...]`` bool, the advantage recursion stops after step t (terminated, truncated,
            or the row is the last of its trajectory segment).
        gamma: discount factor; lam: GAE lambda (1.0 = Monte-Carlo returns minus values).
    """
    shape = rewards.shape
    for name, arr in (("values", values), ("next_values", next_values), ("terminateds", terminateds),
                      ("ends", ends)):
        if arr.shape != shape:
            raise ValueError(f"compute_gae: {name} has shape {arr.shape}, rewards has {shape}")
    not_term = 1.0 - terminateds.astype(np.float32)
    deltas = rewards + gamma * next_values * not_term - values
    carry = gamma * lam * (1.0 - ends.astype(np.float32))
    adv = np.zeros(shape, dtype=np.float32)
    last = np.zeros(shape[1:], dtype=np.float32)
    for t in range(shape[0] - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        adv[t] = last
    return GaeResult(adv, (adv + values).astype(np.float32))


def discounted_returns(
    rewards: np.ndarray,
    ends: np.ndarray,
    gamma: float,
    bootstrap: np.ndarray | None = None,
) -> np.ndarray:
    """Discounted reward-to-go within each episode segment: ``G_t = r_t + gamma * G_{t+1}``.

    ``ends[t]`` stops the sum after step t. ``bootstrap`` (``[T, ...]``, optional) is added at rows
    that end a segment without terminating (truncation or fragment cut): ``G_t = r_t + gamma * b_t``;
    leave it ``None`` for plain REINFORCE returns.
    """
    zeros = np.zeros_like(rewards, dtype=np.float32)
    nv = zeros if bootstrap is None else np.where(ends, bootstrap, 0.0).astype(np.float32)
    term = np.zeros(rewards.shape, dtype=bool)
    return compute_gae(rewards.astype(np.float32), zeros, nv, term, ends, gamma, 1.0).advantages


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y_true - y_pred] / Var[y_true]; 1 is perfect, 0 is no better than a constant."""
    var_y = float(np.var(y_true))
    return float("nan") if var_y == 0 else 1.0 - float(np.var(y_true - y_pred)) / var_y


class NStepResult(NamedTuple):
    rewards: np.ndarray  # [T, ...] sum_{k<m} gamma^k r_{t+k}, m = steps used (<= n)
    discounts: np.ndarray  # [T, ...] gamma^m for bootstrapping from obs t+m; 0 if terminated within m
    offsets: np.ndarray  # [T, ...] int, m: the bootstrap observation is the next obs of row t+m-1


def compute_nstep(
    rewards: np.ndarray, terminateds: np.ndarray, ends: np.ndarray, n: int, gamma: float
) -> NStepResult:
    """n-step returns that stop at episode ends and fragment cuts (``ends``), time-major ``[T, ...]``.

    A window that reaches a termination gets discount 0 (no bootstrap); one cut by a truncation or
    the fragment end bootstraps from the next observation of its last row, with gamma^m.
    """
    if n < 1:
        raise ValueError(f"n-step needs n >= 1, got {n}")
    T = rewards.shape[0]
    out_r = np.zeros(rewards.shape, dtype=np.float32)
    disc = np.ones(rewards.shape, dtype=np.float32)
    offsets = np.zeros(rewards.shape, dtype=np.int64)
    alive = np.ones(rewards.shape, dtype=bool)  # window still open
    term_hit = np.zeros(rewards.shape, dtype=bool)
    for k in range(n):
        idx = np.minimum(np.arange(T) + k, T - 1)
        in_range = (np.arange(T) + k < T).reshape((T,) + (1,) * (rewards.ndim - 1))
        step = alive & in_range
        out_r += np.where(step, disc * rewards[idx], 0.0)
        disc = np.where(step, disc * gamma, disc)
        offsets += step
        term_hit |= step & terminateds[idx]
        alive = step & ~ends[idx]
    disc = np.where(term_hit, 0.0, disc).astype(np.float32)
    return NStepResult(out_r, disc, offsets)


def add_nstep(fragment: SB, n_step: int, gamma: float) -> SB:
    """n-step rewards and discounts, and the observation n steps later, of a time-major fragment
    with NEXT_OBS (NEXT_OBS stays the next one, so recorded data keeps its meaning). Off-policy
    algorithms (DQN, SAC, TD3) learn from these columns."""
    if n_step == 1:  # the same columns as the window below, without it (a 1-step fragment's second-largest cost)
        fragment[SB.NSTEP_NEXT_OBS] = fragment[SB.NEXT_OBS].copy()
        fragment[SB.NSTEP_REWARDS] = fragment[SB.REWARDS].astype(np.float32)
        fragment[SB.NSTEP_DISCOUNT] = np.where(fragment[SB.TERMINATEDS], 0.0, gamma).astype(np.float32)
        return fragment
    res = compute_nstep(fragment[SB.REWARDS], fragment[SB.TERMINATEDS], fragment_ends(fragment), n_step, gamma)
    T, B = fragment[SB.REWARDS].shape
    rows = np.minimum(np.arange(T)[:, None] + np.maximum(res.offsets, 1) - 1, T - 1)
    fragment[SB.NSTEP_NEXT_OBS] = fragment[SB.NEXT_OBS][rows, np.arange(B)[None, :]]
    fragment[SB.NSTEP_REWARDS] = res.rewards
    fragment[SB.NSTEP_DISCOUNT] = res.discounts
    return fragment


class VTraceResult(NamedTuple):
    vs: np.ndarray  # [N] V-trace value targets
    pg_advantages: np.ndarray  # [N] rho_t * (r_t + gamma * vs_{t+1} - V(x_t)), the policy-gradient advantages


def vtrace(
    behaviour_logp: np.ndarray,
    target_logp: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminateds: np.ndarray,
    ends: np.ndarray,
    gamma: float,
    clip_rho: float = 1.0,
    clip_c: float = 1.0,
    lam: float = 1.0,
) -> VTraceResult:
    """V-trace off-policy targets (Espeholt et al. 2018, IMPALA, eq. 1 and remark 1), time-major 1-D.

    Rows are one or more trajectory segments in time order; ``ends[t]`` stops the recursion after t
    (episode end or segment cut) and ``next_values[t]`` is V of the observation after t (its
    bootstrap at a truncation or cut; ignored where ``terminateds``). ``values`` and
    ``next_values`` come from the current (target) value function.
    """
    n = len(rewards)
    log_rho = target_logp.astype(np.float64) - behaviour_logp.astype(np.float64)
    rho = np.exp(np.minimum(log_rho, 50.0))
    rho_bar = np.minimum(clip_rho, rho)
    c = lam * np.minimum(clip_c, rho)
    not_term = 1.0 - terminateds.astype(np.float64)
    deltas = rho_bar * (rewards + gamma * next_values * not_term - values)
    carry = gamma * c * (1.0 - ends.astype(np.float64))
    # backward recursion on python floats (much faster than numpy scalars for a few thousand rows)
    d, k, v = deltas.tolist(), carry.tolist(), values.astype(np.float64).tolist()
    vs_minus_v = [0.0] * n
    acc = 0.0
    for t in range(n - 1, -1, -1):
        acc = d[t] + k[t] * acc
        vs_minus_v[t] = acc
    vs = np.asarray(vs_minus_v) + np.asarray(v)
    vs_next = np.where(ends, next_values, np.r_[vs[1:], 0.0])
    pg_adv = rho_bar * (rewards + gamma * not_term * vs_next - values)
    return VTraceResult(vs.astype(np.float32), pg_adv.astype(np.float32))


def fragment_ends(frag: SB) -> np.ndarray:
    """``[T, B]`` bool: rows after which the return recursion stops (episode end or fragment cut)."""
    ends = frag[SB.TERMINATEDS] | frag[SB.TRUNCATEDS]
    ends[-1] = True
    return ends


def add_gae(fragment: SB, last_values: np.ndarray, gamma: float, lam: float) -> SB:
    """ADVANTAGES and VALUE_TARGETS columns by GAE on a time-major fragment ``[T, B]``.

    ``next_values`` is the next row's V(s); at a truncation that row is the dummy autoreset step,
    whose V was computed on the final observation; ``last_values`` ``[B]`` bootstraps the cut."""
    values = fragment[SB.VF_PREDS]
    next_values = np.concatenate([values[1:], last_values[None]], axis=0)
    res = compute_gae(fragment[SB.REWARDS], values, next_values, fragment[SB.TERMINATEDS], fragment_ends(fragment),
                      gamma, lam)
    fragment[SB.ADVANTAGES] = res.advantages
    fragment[SB.VALUE_TARGETS] = res.value_targets
    return fragment


def normalize_advantages(adv: torch.Tensor) -> torch.Tensor:
    """Standardise over the (mini)batch: zero mean, unit std; one row is returned unchanged."""
    if adv.numel() < 2:
        return adv
    return (adv - adv.mean()) / (adv.std() + 1e-8)


class Postprocessing:
    """RLlib's names of the columns ``compute_advantages`` adds (``Postprocessing.ADVANTAGES``)."""

    ADVANTAGES = SB.ADVANTAGES
    VALUE_TARGETS = SB.VALUE_TARGETS


def compute_advantages(rollout: SB, last_r: float, gamma: float = 0.9, lambda_: float = 1.0, use_gae: bool = True,
                       use_critic: bool = True) -> SB:
    """RLlib's ``compute_advantages`` on one trajectory (1-D rows, time order; what a classic
    ``postprocess_fn`` gets): GAE with ``use_gae``, else discounted returns (minus ``vf_preds`` with
    ``use_critic``); ``last_r`` bootstraps the end. Adds ADVANTAGES and VALUE_TARGETS, in place."""
    rewards = np.asarray(rollout[SB.REWARDS], dtype=np.float32)
    n = len(rewards)
    ends = np.zeros(n, dtype=bool)
    ends[-1:] = True
    if use_gae or use_critic:
        values = np.asarray(rollout[SB.VF_PREDS], dtype=np.float32)
    if use_gae:
        nxt = np.r_[values[1:], np.float32(last_r)].astype(np.float32)
        res = compute_gae(rewards, values, nxt, np.zeros(n, dtype=bool), ends, gamma, lambda_)
        adv, targets = res.advantages, res.value_targets
    else:
        returns = discounted_returns(rewards, ends, gamma, np.full(n, last_r, dtype=np.float32))
        adv, targets = (returns - values, returns) if use_critic else (returns, np.zeros_like(returns))
    rollout[SB.ADVANTAGES] = adv.astype(np.float32)
    rollout[SB.VALUE_TARGETS] = targets.astype(np.float32)
    return rollout


def piecewise(schedule: Sequence[Sequence[float]], t: float) -> float:
    """A piecewise-linear schedule ``[[t0, v0], [t1, v1], ...]`` at ``t`` (held flat past the ends)."""
    return float(np.interp(t, [p[0] for p in schedule], [p[1] for p in schedule]))


def postprocess_episodes(policy: Any, rows: SB) -> SB:
    """Recorded rows (whole or cut episodes, ``eps_id`` contiguous) made ready for ``policy``'s loss:
    each episode piece goes through ``policy.postprocess_trajectory`` as a ``[T, 1]`` fragment, as
    a rollout worker's would; a piece that ends neither terminated nor truncated was cut (like a
    truncation, it bootstraps from V(next_obs)). What offline readers and experience sources use."""
    pieces = rows.split_by_episode()
    last = np.zeros(len(pieces), dtype=np.float32)
    if SB.NEXT_OBS in rows:
        open_ends = [i for i, p in enumerate(pieces) if not p[SB.TERMINATEDS][-1]]
        if open_ends:
            obs = np.stack([pieces[i][SB.NEXT_OBS][-1] for i in open_ends])
            last[open_ends] = policy.compute_values(obs)
    out = []
    for piece, v in zip(pieces, last, strict=True):
        frag = SB()
        for k, col in piece.items():
            dict.__setitem__(frag, k, col[:, None])
        frag = policy.postprocess_trajectory(frag, np.array([v], dtype=np.float32))
        flat = SB()
        for k, col in frag.items():
            dict.__setitem__(flat, k, col[:, 0])
        out.append(flat)
    return out[0] if len(out) == 1 else concat_samples(out)


def clip_rewards(rewards: np.ndarray, clip: bool | float) -> np.ndarray:
    """``algo.clip_rewards``: each reward's sign (true) or the reward clipped to [-clip, clip] (a number)."""
    return (np.sign(rewards) if clip is True else np.clip(rewards, -clip, clip)).astype(np.float32)
