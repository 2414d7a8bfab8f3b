"""A run's evaluation: greedy (or sampled) episodes on envs of their own, single- or multi-agent,
every ``evaluation.interval`` iterations (a hook, rlrun/training/hooks.py), or when asked."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlrun.core.registry import HOOKS
from rlrun.envs.make import env_from_config
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.training.evaluation import EvalResult, evaluate
from rlrun.training.ma_evaluation import evaluate_multi_agent


class Evaluator:
    """A run's evaluation episodes on envs of their own, built at the first evaluation and reused."""

    def __init__(self, cfg: Any, policies: Any, multi_agent: bool) -> None:
        self.cfg, self.policies, self.multi_agent = cfg, policies, multi_agent
        self._env: gym.vector.VectorEnv | None = None

    def evaluate(self) -> EvalResult:
        ev = self.cfg.evaluation
        if self.multi_agent:
            return evaluate_multi_agent(self.policies, self.cfg, ev.num_episodes, self.cfg.seed)
        if self._env is None:
            self._env = env_from_config(self.cfg.env, max(1, min(ev.num_envs, ev.num_episodes)))
        return evaluate(self.policies[DEFAULT_POLICY_ID], self.cfg.env, ev.num_episodes, ev.num_envs, self.cfg.seed,
                        self._env)

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
