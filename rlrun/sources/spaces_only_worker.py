"""The local worker of a run whose local worker never samples: a run without an env (``env.id:
null``, spaces declared in the config; every training row comes from ``input`` files), or a
``rollout=server`` run whose policy servers are Ray workers.

It holds the learner's policies and answers what the trainer asks of a local worker (spaces,
weights, callbacks, episode metrics: none).
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from rlrun.envs.make import env_spaces
from rlrun.policy.policy import DEFAULT_POLICY_ID, PolicyMap
from rlrun.sources.callbacks import CallbackList
from rlrun.sources.worker_base import EpisodeStats, WorkerBase, WorkerSpec


class SpacesOnlyWorker(WorkerBase):
    def __init__(self, spec: WorkerSpec, policy_factory: Callable[[gym.Space, gym.Space], PolicyMap]) -> None:
        self.spec = spec
        self.obs_space, self.action_space = env_spaces(spec.env)  # declared, or of one env copy
        self.policy_map = policy_factory(self.obs_space, self.action_space)
        self.policy = self.policy_map[DEFAULT_POLICY_ID]
        self.callbacks = CallbackList(spec.callbacks)
        self._episodes = EpisodeStats([], [])
        self.explore = True
        self.env_steps_sampled = 0

    def sample(self) -> None:
        raise RuntimeError("this local worker never samples (no env, or the policy servers are Ray workers)")

    def stop(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"SpacesOnlyWorker(obs={self.obs_space}, actions={self.action_space})"
