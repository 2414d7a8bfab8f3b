"""The kinds of rollout worker, registered in ``WORKERS``: which class samples a run's experience.

Each kind registers a loader (its class is imported only when a run uses it) with ``when(cfg, local)``,
true when the run's workers are of that kind (``local``: the learner's own worker, not a Ray worker),
and ``order``: kinds are asked lowest first and the first that answers yes is taken. A plugin adds a
kind the same way (a class with WorkerBase's interface: ``__init__(spec, policy_factory)``, ``sample``,
``get_metrics``, ``stop``, ...)::

    from rlrun import WORKERS

    @WORKERS.register("my_sim", order=50, when=lambda cfg, local: cfg.env.id == "MySim-v0")
    def my_sim_worker():
        return MySimWorker
"""

from __future__ import annotations

from typing import Any

from rlrun.config.schemas import RunConfig
from rlrun.core.registry import WORKERS


def _never_samples(cfg: RunConfig, local: bool) -> bool:
    """No env to sample (``env.id: null``: rows come from ``input`` files), or the local worker of a
    ``rollout=server`` run whose policy servers are Ray workers."""
    serving_remotely = local and cfg.rollout.server is not None and cfg.rollout.num_workers > 0
    return (cfg.rollout.server is None and cfg.env.id is None) or serving_remotely


@WORKERS.register("spaces_only", order=0, when=_never_samples)
def spaces_only() -> type:
    """Knows the env's spaces and holds the policies; never samples."""
    from rlrun.sources.spaces_only_worker import SpacesOnlyWorker

    return SpacesOnlyWorker


@WORKERS.register("server", order=10, when=lambda cfg, local: cfg.rollout.server is not None)
def server() -> type:
    """``rollout=server``: a policy server; external clients drive the episodes."""
    from rlrun.sources.serving.worker import ServerWorker

    return ServerWorker


@WORKERS.register("env", order=100, when=lambda cfg, local: True)
def env() -> type:
    """``num_envs_per_worker`` copies of the env (single- or multi-agent) and the run's policy map."""
    from rlrun.sources.rollout_worker import RolloutWorker

    return RolloutWorker


def worker_kind(cfg: RunConfig, local: bool = False) -> str:
    """The name of the first kind (lowest ``order``) whose ``when`` takes this run."""
    return next(n for n in WORKERS.ordered()
                if (when := WORKERS.entry(n).info.get("when")) is not None and when(cfg, local))


def worker_class(cfg: RunConfig, local: bool = False) -> Any:
    """The worker class of this run's remote workers, or of its local worker with ``local=True``."""
    return WORKERS.get(worker_kind(cfg, local))()
