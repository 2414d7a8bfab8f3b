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
