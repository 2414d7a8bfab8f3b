"""Every metric name rlrun reports, in one leaf module: these are exactly the valid ``stop`` keys.

Names are ``namespace/name``: ``rollout/`` (episodes, from the workers), ``time/`` (where an
iteration's seconds went, throughput), ``workers/`` (health of remote workers), ``train/`` (the
learner; a loss adds its terms as ``train/loss/<term>`` and its stats as ``train/<stat>``),
``eval/`` (greedy evaluation). MLflow draws one chart section per prefix, sorted by name, so the
return curves (``eval/``, ``rollout/``) come before the learner's charts.
"""

from __future__ import annotations

from collections.abc import Iterable

# counters of the result dict; a stop criterion on them is a budget, not a target
STOP_COUNTERS = ("timesteps_total", "training_iteration", "time_total_s", "episodes_total")

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
POLICY_METRICS = ("train/loss/total", "train/grad_norm", "train/lr", "train/num_sgd_steps", "train/explained_variance")
EVAL_METRICS = ("eval/episode_return_mean", "eval/episode_return_min", "eval/episode_return_max",
                "eval/episode_len_mean", "eval/num_episodes")
EPISODE_WINDOW = 100  # rollout/episode_* are over the last 100 completed episodes


def reported_metrics(algo_metrics: Iterable[str], loss_terms: Iterable[str], loss_stats: Iterable[str]) -> list[str]:
    """Every metric a run reports, given its algorithm's own metrics and its loss's terms and stats."""
    names = [*ROLLOUT_METRICS, *TIME_METRICS, *WORKER_METRICS, *POLICY_METRICS, *EVAL_METRICS, *algo_metrics]
    names += [f"train/loss/{t}" for t in loss_terms]
    names += [f"train/{s}" for s in loss_stats]
    return sorted(set(names))

# Metrics that stay exactly 0 unless a feature is on (PPO's KL penalty; worker restarts and dropped
# fragments): not logged until they first differ from 0, so the MLflow page shows no flat-zero charts.
ZERO_UNTIL_USED = ("train/loss/kl", "train/kl_coeff", "workers/num_restarts", "workers/num_dropped_fragments")


def without_unused(metrics: dict[str, float], used: set[str]) -> dict[str, float]:
    """``metrics`` minus the ``ZERO_UNTIL_USED`` ones that have been 0 so far (``used`` is updated)."""
    used.update(k for k in ZERO_UNTIL_USED if metrics.get(k, 0.0) != 0.0)
    return {k: v for k, v in metrics.items() if k not in ZERO_UNTIL_USED or k in used}
