"""The local worker of a run without an env (``env.id: null``, spaces declared in the config).

It holds the learner's policies and answers what the trainer asks of a local worker (spaces,
weights, callbacks, episode metrics: none); every training row comes from ``input`` files, so
it never samples.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from rlrun.callbacks import CallbackList
from rlrun.envs import declared_spaces
from rlrun.policy import DEFAULT_POLICY_ID, PolicyMap
from rlrun.workers import EpisodeStats, WorkerBase, WorkerSpec


class SpacesOnlyWorker(WorkerBase):
    def __init__(self, spec: WorkerSpec, policy_factory: Callable[[gym.Space, gym.Space], PolicyMap]) -> None:
        self.spec = spec
        spaces = declared_spaces(spec.env)
        assert spaces is not None, "check_env_config requires declared spaces with env.id: null"
        self.obs_space, self.action_space = spaces
        self.policy_map = policy_factory(self.obs_space, self.action_space)
        self.policy = self.policy_map[DEFAULT_POLICY_ID]
        self.callbacks = CallbackList(spec.callbacks)
        self._episodes = EpisodeStats([], [])
        self.explore = True
        self.env_steps_sampled = 0

    def sample(self) -> None:
        raise RuntimeError("env.id is null: this run has no env to sample (check_env_config refuses input=sampler)")

    def stop(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"SpacesOnlyWorker(obs={self.obs_space}, actions={self.action_space})"
