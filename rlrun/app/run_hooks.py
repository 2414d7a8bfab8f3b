"""What a run does after each training iteration besides the Trainer's own hooks (evaluation,
off-policy estimates, callbacks: rlrun/training/hooks.py): record the iteration (the run's history,
MLflow through the writer process), show it on the progress line, and write a checkpoint every
``checkpoint.every_n_iters``. Each is a ``RunHook`` built once per run, called in this order; the
stop criterion is checked after them, so a stopping iteration is recorded and shown like any other.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from rlrun.app.run_files import write_checkpoint
from rlrun.core.metrics import without_unused
from rlrun.tracking.tracker import clean_metrics


class RunHook(Protocol):
    def after_iteration(self, ctx: Any, trainer: Any, result: dict[str, float]) -> None:
        """``ctx``: the run's shared state (rlrun/app/runner.py: ``RunContext``)."""
        ...


def numbers(result: Mapping[str, Any]) -> dict[str, float]:
    """Every number of an iteration's result, as a float (NaN included: no episode finished yet)."""
    return {k: float(v) for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def mlflow_row(metrics: Mapping[str, float], used: set[str]) -> dict[str, float]:
    """What MLflow gets of an iteration: its finite numbers, less the metrics still unused (``used``
    is updated; replaying the history in order with a fresh set gives the same rows)."""
    return without_unused(clean_metrics(metrics), used)


class RecordIteration:
    """The iteration into the run's history (``<output_dir>/metrics.jsonl``) and, as one metric row at
    its env step, to MLflow (a tracker whose writer died fails the run here, not at the end)."""

    def after_iteration(self, ctx: Any, trainer: Any, result: dict[str, float]) -> None:
        step, ms = int(result["timesteps_total"]) + ctx.step_offset, int(time.time() * 1000)
        ctx.history.append(numbers(result), step, ms)
        ctx.tracker.check()
        ctx.tracker.log_metrics(mlflow_row(result, ctx.used_metrics), step, ms)


class ShowProgress:
    def after_iteration(self, ctx: Any, trainer: Any, result: dict[str, float]) -> None:
        ctx.progress.update(result)


class CheckpointEvery:
    """A checkpoint every ``n`` iterations (the final one is written when the run ends)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def after_iteration(self, ctx: Any, trainer: Any, result: dict[str, float]) -> None:
        if trainer.iteration % self.n == 0:
            write_checkpoint(trainer, ctx.cfg, result, ctx.out_dir, ctx.config_dict, ctx.tracker, ctx.history,
                             ctx.run_key, ctx.run_name)


class TagWorkerNodes:
    """After a Ray worker was restarted (its node may have died: it runs elsewhere now), the MLflow tags
    ``ray.worker.<i>.node`` say where the workers run; a restarted worker not placed yet is asked again
    after the next iteration."""

    def __init__(self) -> None:
        self.restarts = 0

    def after_iteration(self, ctx: Any, trainer: Any, result: dict[str, float]) -> None:
        workers = trainer.workers
        if workers.num_worker_restarts == self.restarts:
            return
        nodes = workers.placement(timeout_s=0.5)
        if nodes is not None:
            self.restarts = workers.num_worker_restarts
            ctx.tracker.set_tags({f"ray.worker.{i}.node": node for i, node in nodes.items()})


def build_run_hooks(cfg: Any) -> list[RunHook]:
    every = cfg.checkpoint.every_n_iters
    return [RecordIteration(), ShowProgress(), *([CheckpointEvery(every)] if every else []),
            *([TagWorkerNodes()] if cfg.rollout.num_workers > 0 else [])]
