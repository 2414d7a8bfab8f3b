"""The policy side of multi-agent runs: the agent -> policy map, each policy's spaces, and heuristic
policies (act, never learn). The env interface is ``rlrun/envs/multi_agent.py``."""


from __future__ import annotations

import fnmatch
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError
from rlrun.core.metrics import DEFAULT_POLICY_ID
from rlrun.core.registry import HEURISTICS, POLICY_MAPPINGS, RegistryError
from rlrun.envs.make import env_spaces
from rlrun.envs.multi_agent import ObsAdapter, make_multi_agent_env


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
        from rlrun.policy.policy import ActionOutput

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


def run_spaces(cfg: RunConfig) -> dict[str, tuple[gym.Space, gym.Space]]:
    """``{policy_id: (obs space, action space)}`` of a run: a single-agent run's ``default_policy`` has
    its env's spaces (declared, or of one env copy); a multi-agent run's policies have those of the
    agents mapped to them (one copy of its env is made and closed)."""
    if not cfg.multiagent.policies:
        return {DEFAULT_POLICY_ID: env_spaces(cfg.env)}
    env = make_multi_agent_env(cfg.env.id, cfg.env.kwargs)
    try:
        return policy_spaces(cfg, env)[2]
    finally:
        env.close()


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
