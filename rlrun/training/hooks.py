"""What runs after each training iteration besides learning: evaluation, off-policy estimates, the
user's callbacks. Each is a hook registered by name in ``HOOKS`` (info: ``order``, lower runs first),
built once per run from the Trainer; a factory returns None when the run's config does not ask for
it. A plugin adds one the same way::

    from rlrun import HOOKS

    @HOOKS.register("grad_norms", order=50)
    def grad_norms(trainer):
        return MyHook() if trainer.cfg.algo.name == "ppo" else None   # after_iteration, close
"""

from __future__ import annotations

from typing import Any, Protocol

from rlrun.core.registry import HOOKS


class IterationHook(Protocol):
    def after_iteration(self, trainer: Any, result: dict[str, float]) -> None:
        """Read the finished iteration; add metrics to ``result`` (names from rlrun/core/metrics.py)."""
        ...

    def close(self) -> None:
        """Release what the hook holds (envs, files) when the run stops."""
        ...


def build_hooks(trainer: Any) -> list[IterationHook]:
    """The registered hooks this run asks for, in ``order``."""
    return [hook for name in HOOKS.ordered() if (hook := HOOKS.get(name)(trainer)) is not None]


class CallbacksHook:
    """The users' ``on_train_result``: last, so a callback sees every metric of the iteration."""

    def __init__(self, callbacks: Any) -> None:
        self.callbacks = callbacks

    def after_iteration(self, trainer: Any, result: dict[str, float]) -> None:
        self.callbacks.call("on_train_result", trainer=trainer, result=result)

    def close(self) -> None:
        pass


@HOOKS.register("callbacks", order=1000)
def callbacks_hook(trainer: Any) -> CallbacksHook | None:
    return CallbacksHook(trainer.callbacks) if trainer.callbacks else None


class SnapshotHook:
    """Snapshot policies (``multiagent.policies.<id>.snapshot_of``): each holds its source's weights as
    they were at the start and after every ``snapshot_interval``-th iteration, and is never trained
    (self-play against a past self). The workers get the new weights at once."""

    def __init__(self, trainer: Any, sources: dict[str, tuple[str, int]]) -> None:
        self.sources = sources
        for pid in sources:
            self._copy(trainer, pid)
        trainer.workers.sync_weights(trainer.timesteps_total)

    def _copy(self, trainer: Any, pid: str) -> None:
        trainer.policies[pid].set_weights(trainer.policies[self.sources[pid][0]].get_weights())

    def restored(self, trainer: Any, state: dict[str, Any]) -> None:
        """After a checkpoint's restore: a snapshot the checkpoint has no weights for (added on resume)
        starts from its source's restored weights."""
        for pid in self.sources:
            if pid not in state["policies"]:
                self._copy(trainer, pid)

    def after_iteration(self, trainer: Any, result: dict[str, float]) -> None:
        due = [pid for pid, (_, every) in self.sources.items() if trainer.iteration % every == 0]
        for pid in due:
            self._copy(trainer, pid)
        if due:
            trainer.workers.sync_weights(trainer.timesteps_total)

    def close(self) -> None:
        pass


@HOOKS.register("snapshots", order=900)
def snapshot_hook(trainer: Any) -> SnapshotHook | None:
    from rlrun.config.multi_agent import snapshots

    sources = snapshots(trainer.cfg)
    return SnapshotHook(trainer, sources) if sources else None
