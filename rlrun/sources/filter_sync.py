"""Observation filters across workers (``rollout.observation_filter: mean_std``).

Each worker's filters update their running statistics as it samples. A remote worker reports what its
filters saw since its last report with its episodes (``EpisodeStats.filter_deltas``, in the same reply
as its samples); the learner merges that into its own, central filters, and sends the merged state out
with the next weights (in the same remote call), so every worker normalises as the learner does. The
learner's local worker shares the learner's policies, so its filters are the central ones.

Built by the WorkerSet only when the run normalises observations: a run without filters does none of it.
"""

from __future__ import annotations

from typing import Any

from rlrun.sources.worker_base import EpisodeStats, WorkerBase


class FilterSync:
    def __init__(self, local_worker: WorkerBase) -> None:
        self.local_worker = local_worker

    def merge(self, eps: EpisodeStats) -> None:
        """A remote worker's report: its filters' statistics since its last one join the central filters."""
        self.local_worker.apply_filter_deltas(eps.filter_deltas or {})

    def state(self) -> dict[str, Any] | None:
        """The central filters' state, sent to remote workers with the weights."""
        return self.local_worker.get_filters() or None


def make_filter_sync(cfg: Any, local_worker: WorkerBase) -> FilterSync | None:
    """The run's filter sync, or None when it normalises no observations."""
    return FilterSync(local_worker) if cfg.rollout.observation_filter != "none" else None
