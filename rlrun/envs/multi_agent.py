"""Multi-agent envs: the env interface, PettingZoo envs, and one agent's observations as float32 arrays.

The env interface is PettingZoo's Parallel API, so a PettingZoo parallel env *is* an rlrun
multi-agent env and one written for rlrun runs under PettingZoo's tools:

    env.possible_agents                      every agent id that may ever act
    env.agents                               the agents acting now (empty = the episode is over)
    env.observation_space(agent), env.action_space(agent)
    env.reset(seed=None) -> (obs, infos)     dicts keyed by agent id
    env.step(actions) -> (obs, rewards, terminateds, truncateds, infos)

Agents may join (appear in ``agents`` and ``obs``) and leave (after their terminated or truncated
flag) during an episode. Env ids: a name registered with ``ENVS.register(name, multi_agent=True)``
(a ``(**kwargs) -> env`` factory), or ``pettingzoo:<module>`` for any module with ``parallel_env``
(or an AEC ``env``, converted with PettingZoo's ``aec_to_parallel``), e.g.
``pettingzoo:pettingzoo.classic.rps_v2`` or ``pettingzoo:mpe2.simple_spread_v3``.

Observations reach policies as float32 arrays: ``Discrete(n)`` observations are one-hot encoded.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.multi_agent import (
    PETTINGZOO,
)
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError
from rlrun.core.registry import ENVS, RegistryError


# --------------------------------------------------------------------------- envs
class ObsAdapter:
    """Turns one agent's observations into float32 arrays (``Discrete(n)``: one-hot)."""

    def __init__(self, space: gym.Space) -> None:
        self.discrete = isinstance(space, gym.spaces.Discrete)
        if isinstance(space, gym.spaces.Discrete):
            self.n, self.start = int(space.n), int(space.start)
            self.space: gym.Space = gym.spaces.Box(0.0, 1.0, (self.n,), np.float32)
        elif isinstance(space, gym.spaces.Box):
            self.space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape,
                                        np.float32)
        else:
            raise PluginError(f"env.id: observation space {space} is not supported for multi-agent runs yet "
                              "(Box and Discrete are)")

    def __call__(self, obs: Any) -> np.ndarray:
        if self.discrete:
            out = np.zeros(self.n, np.float32)
            out[int(obs) - self.start] = 1.0
            return out
        return np.asarray(obs, dtype=np.float32)


def make_multi_agent_env(env_id: str | None, kwargs: dict[str, Any] | None = None) -> Any:
    """One multi-agent env (Parallel API) from a registered name or a ``pettingzoo:<module>`` id."""
    if env_id is None:
        raise ConfigError("multiagent: a multi-agent run needs its env (env.id is null)")
    kwargs = dict(kwargs or {})
    if env_id.startswith(PETTINGZOO):
        module_name = env_id[len(PETTINGZOO):]
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise RegistryError(f"env.id: cannot import '{module_name}' for {env_id}: {e}") from None
        try:
            if hasattr(module, "parallel_env"):
                return module.parallel_env(**kwargs)
            if hasattr(module, "env"):
                from pettingzoo.utils.conversions import aec_to_parallel

                return aec_to_parallel(module.env(**kwargs))
        except TypeError as e:
            raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None
        raise RegistryError(f"env.id: module '{module_name}' has neither parallel_env() nor env() (PettingZoo's API)")
    entry = ENVS.entry(env_id, "env.id")
    try:
        return entry.obj(**kwargs)
    except TypeError as e:
        raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None


class MultiCartPole:
    """``num_agents`` independent CartPole-v1 poles, one per agent (RLlib's classic MultiAgentCartPole):
    each agent's episode ends on its own (fall: terminated, 500 steps: truncated); the env's episode
    ends when every pole is done."""

    metadata = {"render_modes": ["rgb_array"], "name": "multi_cartpole"}

    def __init__(self, num_agents: int = 4, render_mode: str | None = None) -> None:
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv

        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self.render_mode = render_mode
        self._poles = {a: CartPoleEnv(render_mode=render_mode) for a in self.possible_agents}
        self._steps = dict.fromkeys(self.possible_agents, 0)

    def observation_space(self, agent: str) -> gym.Space:
        return self._poles[agent].observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self._poles[agent].action_space

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        obs = {}
        for i, a in enumerate(self.agents):
            obs[a], _ = self._poles[a].reset(seed=None if seed is None else seed + i)
            self._steps[a] = 0
        return obs, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rew, term, trunc = {}, {}, {}, {}
        for a in self.agents:
            obs[a], rew[a], term[a], _, _ = self._poles[a].step(actions[a])
            self._steps[a] += 1
            trunc[a] = self._steps[a] >= 500 and not term[a]
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in obs}

    def render(self) -> Any:
        frames = [self._poles[a].render() for a in self.possible_agents]
        return np.concatenate(frames, axis=1) if frames and frames[0] is not None else None

    def close(self) -> None:
        for pole in self._poles.values():
            pole.close()
