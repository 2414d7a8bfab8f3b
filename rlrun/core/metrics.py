"""Every metric name rlrun reports, in one leaf module: these are exactly the valid ``stop`` keys.

Names are ``namespace/name``: ``rollout/`` (episodes, from the workers), ``time/`` (where an
iteration's seconds went, throughput), ``workers/`` (health of remote workers), ``train/`` (the
learner; a loss adds its terms as ``train/loss/<term>`` and its stats as ``train/<stat>``),
``eval/`` (greedy evaluation), ``offline/`` (rows read from ``input`` files), ``server/`` (the
policy server of ``rollout=server``). MLflow draws one chart section per prefix, sorted by name, so the
return curves (``eval/``, ``rollout/``) come before the learner's charts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

# counters of the result dict; a stop criterion on them is a budget, not a target
STOP_COUNTERS = ("timesteps_total", "training_iteration", "time_total_s", "episodes_total")

# A single-agent run is the one-policy case of a multi-agent run: its policy map holds this id only, and
# what is named per policy (learner metrics, ``output`` directories) keeps the run's plain names for it.
DEFAULT_POLICY_ID = "default_policy"
ROLLOUT_METRICS = (
    "rollout/episode_return_mean", "rollout/episode_return_min", "rollout/episode_return_max",
    "rollout/episode_len_mean", "rollout/episodes_this_iter", "rollout/env_steps_this_iter",
)
TIME_METRICS = (
    "time/env_steps_per_s",  # env steps sampled per second of the whole iteration
    "time/learn_throughput",  # rows trained on (minibatch rows x SGD steps) per second of learning
    "time/sample_s", "time/learn_s", "time/sync_weights_s", "time/iteration_s",
)
WORKER_METRICS = ("workers/num_healthy", "workers/num_restarts", "workers/num_dropped_fragments")
# rollout=server: episodes clients left (timed out), episodes open now, requests served / refused (4xx, 5xx)
SERVER_METRICS = ("workers/num_abandoned_episodes", "server/open_episodes", "server/requests",
                  "server/rejected_requests")
POLICY_METRICS = ("train/loss/total", "train/grad_norm", "train/lr", "train/num_sgd_steps", "train/explained_variance")
EVAL_METRICS = ("eval/episode_return_mean", "eval/episode_return_min", "eval/episode_return_max",
                "eval/episode_len_mean", "eval/num_episodes")
OFFLINE_METRICS = ("offline/rows_read", "offline/passes")  # rows read from input files; full passes over them
EPISODE_WINDOW = 100  # default of metrics_num_episodes_for_smoothing: rollout/episode_* over the last 100 episodes


# multi-agent runs: per policy, over the episodes of the agents it acts for
POLICY_ROLLOUT_METRICS = ("episode_return_mean", "episode_return_min", "episode_return_max", "episodes_this_iter")


def reported_metrics(algo_metrics: Iterable[str], loss_terms: Iterable[str], loss_stats: Iterable[str],
                     policies: Iterable[str] = (), learned: Iterable[str] = ()) -> list[str]:
    """Every metric a run reports, given its algorithm's own metrics and its loss's terms and stats.
    Multi-agent runs (``policies``) add ``rollout/<policy>/...`` for every policy and, for the
    ``learned`` ones, the learner's ``train/...`` metrics as ``train/<policy>/...``."""
    algo_metrics, policies, learned = list(algo_metrics), list(policies), list(learned)
    learner = [*POLICY_METRICS, *(m for m in algo_metrics if m.startswith("train/"))]
    learner += [f"train/loss/{t}" for t in loss_terms]
    learner += [f"train/{s}" for s in loss_stats]
    names = [*ROLLOUT_METRICS, *TIME_METRICS, *WORKER_METRICS, *SERVER_METRICS, *EVAL_METRICS, *OFFLINE_METRICS,
             *algo_metrics]
    if not policies:
        return sorted({*names, *learner})
    names.append("rollout/agent_steps_this_iter")
    names += [f"rollout/{pid}/{m}" for pid in policies for m in POLICY_ROLLOUT_METRICS]
    names += [f"eval/{pid}/episode_return_mean" for pid in policies]
    names += [per_policy(m, pid) for pid in learned for m in learner]
    return sorted(set(names))


def seat_metric_name(policy_id: str, seat: str) -> str:
    """A policy's evaluation return in one seat (evaluation with ``env.shuffle_seats``)."""
    return f"eval/{policy_id}/seat/{seat}/episode_return_mean"


def seat_metric(key: str) -> tuple[str, str] | None:
    """``seat_metric_name``'s (policy, seat), else None."""
    parts = key.split("/")
    if len(parts) == 5 and parts[0] == "eval" and parts[2] == "seat" and parts[4] == "episode_return_mean":
        return parts[1], parts[3]
    return None


def per_policy(name: str, policy_id: str) -> str:
    """``train/loss/total`` -> ``train/<policy_id>/loss/total`` (a learner metric of one policy). The
    default policy (a single-agent run's only one) has the plain names."""
    if policy_id == DEFAULT_POLICY_ID:
        return name
    head, _, rest = name.partition("/")
    return f"{head}/{policy_id}/{rest}"


def _common_name(name: str) -> str:
    """``train/p0/loss/kl`` -> ``train/loss/kl``: a per-policy learner metric's single-agent name."""
    parts = name.split("/")
    return "/".join([parts[0], *parts[2:]]) if len(parts) > 2 and parts[0] == "train" and parts[1] != "loss" else name

# Metrics that stay exactly 0 unless a feature is on (PPO's KL penalty; worker restarts and dropped
# fragments): not logged until they first differ from 0, so the MLflow page shows no flat-zero charts.
ZERO_UNTIL_USED = ("train/loss/kl", "train/kl_coeff", "workers/num_restarts", "workers/num_dropped_fragments",
                   "workers/num_abandoned_episodes")


def without_unused(metrics: dict[str, float], used: set[str]) -> dict[str, float]:
    """``metrics`` minus the ``ZERO_UNTIL_USED`` ones that have been 0 so far (``used`` is updated)."""
    used.update(k for k, v in metrics.items() if v != 0.0 and _common_name(k) in ZERO_UNTIL_USED)
    return {k: v for k, v in metrics.items() if _common_name(k) not in ZERO_UNTIL_USED or k in used}


def mean_min_max(prefix: str, values: Iterable[float]) -> dict[str, float]:
    """``<prefix>_mean``, ``<prefix>_min`` and ``<prefix>_max`` of ``values`` (NaN each when empty)."""
    v = np.asarray(list(values), dtype=np.float64)
    if not len(v):
        return {f"{prefix}_mean": math.nan, f"{prefix}_min": math.nan, f"{prefix}_max": math.nan}
    return {f"{prefix}_mean": float(v.mean()), f"{prefix}_min": float(v.min()), f"{prefix}_max": float(v.max())}
