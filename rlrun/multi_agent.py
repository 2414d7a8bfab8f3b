"""Multi-agent runs: the env interface, PettingZoo envs, heuristic policies and the agent -> policy map.

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

import fnmatch
import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config import ConfigError, RunConfig
from rlrun.errors import PluginError
from rlrun.multi_agent_config import (
    PETTINGZOO,
)
from rlrun.registry import ENVS, HEURISTICS, POLICY_MAPPINGS, RegistryError


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




# --------------------------------------------------------------------------- heuristic policies
class HeuristicPolicy:
    """A policy that acts but never learns: no weights, no optimizer. Subclasses implement ``act``."""

    learns = False

    def __init__(self, policy_id: str, obs_space: gym.Space, action_space: gym.Space, seed: int = 0) -> None:
        import torch

        self.policy_id = policy_id
        self.observation_space = obs_space
        self.action_space = action_space
        self.generator = torch.Generator().manual_seed(seed)  # the worker reseeds it; act() uses np_rng
        self.np_rng = np.random.default_rng(seed)
        self.global_timestep = 0
        self.num_rows_trained = 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reseed(self, seed: int) -> None:
        """As ``Policy.reseed``: both generators restart from ``seed``, in place."""
        self.generator.manual_seed(seed)
        self.np_rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state

    def filter_obs(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        return obs  # heuristics read raw observations

    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> Any:
        from rlrun.policy import ActionOutput

        actions = np.asarray(self.act(obs))
        b = len(obs)
        return ActionOutput(actions, np.zeros(b, np.float32), np.zeros(b, np.float32), np.zeros((b, 0), np.float32))

    def get_weights(self) -> dict[str, np.ndarray]:
        return {}

    def set_weights(self, weights: Any) -> None:
        pass

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        return {"rng": self.np_rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self.np_rng.bit_generator.state = state["rng"]


@HEURISTICS.register("random")
class RandomPolicy(HeuristicPolicy):
    """Uniformly random actions from the action space."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return space.start + self.np_rng.integers(0, space.n, size=len(obs))
        if isinstance(space, gym.spaces.Box):
            return self.np_rng.uniform(space.low, space.high, size=(len(obs), *space.shape)).astype(np.float32)
        raise PluginError(f"heuristic 'random': action space {space} is not supported")


@HEURISTICS.register("always_same")
class AlwaysSamePolicy(HeuristicPolicy):
    """The same action every step (``heuristic_kwargs: {action: 0}``; default the first action)."""

    def __init__(self, policy_id: str, obs_space: gym.Space, action_space: gym.Space, seed: int = 0,
                 action: Any = None) -> None:
        super().__init__(policy_id, obs_space, action_space, seed)
        first = getattr(action_space, "start", 0) if isinstance(action_space, gym.spaces.Discrete) else \
            np.zeros(tuple(action_space.shape or ()), np.float32)
        self.action = np.asarray(first if action is None else action)
        if not action_space.contains(self.action.astype(action_space.dtype)):
            raise ConfigError(f"multiagent.policies.{policy_id}.heuristic_kwargs.action: {action!r} is not in the "
                              f"action space {action_space}")

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.repeat(self.action[None], len(obs), axis=0)


# --------------------------------------------------------------------------- agents -> policies
def agent_to_policy(cfg: RunConfig, agent: str) -> str:
    ma = cfg.multiagent
    if ma.policy_mapping_fn is not None:
        pid = str(POLICY_MAPPINGS.get(ma.policy_mapping_fn)(agent))
        if pid not in ma.policies:
            raise ConfigError(f"multiagent.policy_mapping_fn: '{ma.policy_mapping_fn}' mapped agent '{agent}' to "
                              f"unknown policy '{pid}'; policies: {', '.join(ma.policies)}")
        return pid
    for pid, patterns in ma.policy_mapping.items():
        if any(fnmatch.fnmatchcase(agent, pattern) for pattern in patterns):
            return pid
    if not ma.policy_mapping and len(ma.policies) == 1:
        return next(iter(ma.policies))
    written = ", ".join(f"{pid}: {pats}" for pid, pats in ma.policy_mapping.items()) or "none"
    raise ConfigError(f"multiagent.policy_mapping: no pattern covers agent '{agent}' ({written}); add one, "
                      "e.g. '*' to the last policy")


def policy_spaces(cfg: RunConfig, env: Any) -> tuple[dict[str, str], dict[str, ObsAdapter], dict[str, tuple]]:
    """Agent -> policy, agent -> observation adapter, policy -> (obs space, action space); raises
    ConfigError if agents sharing a policy have different spaces."""
    mapping: dict[str, str] = {}
    adapters: dict[str, ObsAdapter] = {}
    spaces: dict[str, tuple] = {}
    first: dict[str, str] = {}
    for agent in env.possible_agents:
        pid = agent_to_policy(cfg, agent)
        mapping[agent] = pid
        adapters[agent] = ObsAdapter(env.observation_space(agent))
        pair = (adapters[agent].space, env.action_space(agent))
        if pid not in spaces:
            spaces[pid], first[pid] = pair, agent
        elif pair[0] != spaces[pid][0] or pair[1] != spaces[pid][1]:
            raise ConfigError(
                f"multiagent.policy_mapping: agents '{first[pid]}' and '{agent}' share policy '{pid}' but their spaces "
                f"differ ({spaces[pid][0]}, {spaces[pid][1]} vs {pair[0]}, {pair[1]}); map them to different policies")
    unused = [pid for pid in cfg.multiagent.policies if pid not in spaces]
    if unused:
        raise ConfigError(f"multiagent.policies: no agent of {cfg.env.id} is mapped to {', '.join(unused)} "
                          f"(agents: {', '.join(env.possible_agents)})")
    return mapping, adapters, spaces


def probe_multi_agent_env(cfg: RunConfig) -> None:
    """Build the env once before compute: mapping and spaces checked, one reset and step tried."""
    try:
        env = make_multi_agent_env(cfg.env.id, cfg.env.kwargs)
    except (RegistryError, ConfigError):
        raise
    except Exception as e:
        raise PluginError(f"env.id: creating {cfg.env.id} with {cfg.env.kwargs or {}} failed: "
                          f"{type(e).__name__}: {e}") from None
    try:
        _, adapters, _ = policy_spaces(cfg, env)
        obs, _ = env.reset(seed=cfg.seed)
        for agent, o in obs.items():
            adapters[agent](o)
        out = env.step({a: env.action_space(a).sample() for a in env.agents})
        if len(out) != 5 or not all(isinstance(d, dict) for d in out):
            raise PluginError(f"env.id: {cfg.env.id}.step() must return 5 dicts keyed by agent id "
                              "(obs, rewards, terminateds, truncateds, infos)")
    finally:
        env.close()
