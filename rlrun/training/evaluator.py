"""A run's evaluation: greedy (or sampled) episodes on envs of their own, single- or multi-agent,
every ``evaluation.interval`` iterations (a hook, rlrun/training/hooks.py), or when asked."""

from __future__ import annotations

from typing import Any

from rlrun.core.registry import HOOKS
from rlrun.training.evaluation import EvalResult, evaluate_run, evaluation_env


class Evaluator:
    """A run's evaluation episodes on envs of their own, built at the first evaluation and reused."""

    def __init__(self, cfg: Any, policies: Any) -> None:
        self.cfg, self.policies = cfg, policies
        self._env: Any = None

    def evaluate(self) -> EvalResult:
        ev = self.cfg.evaluation
        if self._env is None:
            self._env = evaluation_env(self.cfg, ev.num_episodes, ev.num_envs)
        return evaluate_run(self.policies, self.cfg, ev.num_episodes, ev.num_envs, self.cfg.seed, self._env)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class EvaluationHook:
    """``evaluation.interval``: every that many iterations, ``eval/*`` from the trainer's evaluator."""

    def __init__(self, evaluator: Evaluator, interval: int) -> None:
        self.evaluator, self.interval = evaluator, interval

    def after_iteration(self, trainer: Any, result: dict[str, float]) -> None:
        if trainer.iteration % self.interval == 0:
            result.update(self.evaluator.evaluate().metrics())

    def close(self) -> None:
        self.evaluator.close()


@HOOKS.register("evaluation", order=10)
def evaluation_hook(trainer: Any) -> EvaluationHook | None:
    interval = trainer.cfg.evaluation.interval
    return EvaluationHook(trainer.evaluator, interval) if interval else None
