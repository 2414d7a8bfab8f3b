"""A run's env copies as the rollout worker samples them: one interface for single- and multi-agent envs.

The interface is the multi-agent vector env's (``rlrun/envs/multi_agent.py``): ``possible_agents``,
``observation_space(agent)``, ``action_space(agent)``, ``reset(seed) -> (obs, acting)`` and
``step(actions) -> VectorStep``, every value a dict keyed by agent id of arrays over the copies. A
single-agent env is the case of one agent (``OneAgentEnv``): its copies are the sub-envs of a gymnasium
vector env, whose next-step autoreset is exactly the multi-agent rule (a copy whose episode ended is
reset on the next step, in which no agent acts and whose reward counts for nothing). Single-agent
observations keep their dtype (uint8 frames stay uint8); only multi-agent ones go through ``ObsAdapter``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.multi_agent import is_multi_agent_env
from rlrun.envs.make import env_from_config
from rlrun.envs.multi_agent import VectorStep, make_vector_multi_agent_env

AGENT = "agent_0"  # the one agent of a single-agent env


class OneAgentEnv:
    """A gymnasium vector env as a vector env of one agent. ``infos``: the vector env's batched infos of
    the last reset or step (what single-agent callbacks see)."""

    one_agent = True
    possible_agents = [AGENT]

    def __init__(self, vector_env: gym.vector.VectorEnv) -> None:
        self.vector_env = vector_env
        self.num_envs = int(vector_env.num_envs)
        self.infos: Mapping[str, Any] = {}
        self._acting = np.ones(self.num_envs, dtype=bool)  # False: the sub-env takes its autoreset step next

    def observation_space(self, agent: str) -> gym.Space:
        return self.vector_env.single_observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self.vector_env.single_action_space

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        obs, self.infos = self.vector_env.reset(seed=seed)
        self._acting = np.ones(self.num_envs, dtype=bool)
        return {AGENT: obs}, {AGENT: self._acting}

    def step(self, actions: Mapping[str, np.ndarray]) -> VectorStep:
        obs, rew, term, trunc, self.infos = self.vector_env.step(actions[AGENT])
        stepped = self._acting  # the sub-envs not taking their autoreset step now
        end = np.logical_or(term, trunc)
        end &= stepped
        self._acting = acting = ~end
        return VectorStep({AGENT: obs}, {AGENT: rew}, {AGENT: term}, {AGENT: trunc}, {AGENT: acting}, stepped, end)

    def close(self) -> None:
        self.vector_env.close()


def env_copies(env: Any, num_envs: int) -> Any:
    """``num_envs`` copies of the configured env (an ``EnvConfig``) behind the multi-agent vector interface."""
    if is_multi_agent_env(env.id):
        return make_vector_multi_agent_env(env.id, num_envs, env.kwargs, env.vectorize)
    return OneAgentEnv(env_from_config(env, num_envs))
