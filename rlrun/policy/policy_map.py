"""A run's policies seen from its env: the agent -> policy map and each policy's spaces (a single-agent
run's one agent acts for ``default_policy``), and heuristic policies (act, never learn). The env side
is ``rlrun/envs/copies.py``."""


from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.multi_agent import policy_configs, snapshots
from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError, suggest
from rlrun.core.metrics import seat_metric
from rlrun.core.registry import HEURISTICS, POLICY_MAPPINGS
from rlrun.data.spaces import MaskedBox
from rlrun.envs.action_mask import random_legal_actions
from rlrun.envs.copies import agent_spaces, copy_agent_spaces


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
    """Uniformly random actions from the action space (from the legal ones, under an action mask)."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        space = self.action_space
        if isinstance(self.observation_space, MaskedBox) and isinstance(space, gym.spaces.Discrete):
            return space.start + random_legal_actions(self.np_rng, obs, self.observation_space, int(space.n))
        if isinstance(space, gym.spaces.Discrete):
            return space.start + self.np_rng.integers(0, space.n, size=len(obs))
        if isinstance(space, gym.spaces.Box):
            return self.np_rng.uniform(space.low, space.high, size=(len(obs), *space.shape)).astype(np.float32)
        raise PluginError(f"heuristic 'random': action space {space} is not supported")


@HEURISTICS.register("always_same")
class AlwaysSamePolicy(HeuristicPolicy):
    """The same action every step (``heuristic_kwargs: {action: 0}``; default the first action); under an
    action mask, the first legal action where that one is illegal."""

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
        actions = np.repeat(self.action[None], len(obs), axis=0)
        if isinstance(self.observation_space, MaskedBox) and isinstance(self.action_space, gym.spaces.Discrete):
            legal = self.observation_space.legal(obs)
            start = self.action_space.start
            ok = legal[np.arange(len(obs)), actions - start]
            actions = np.where(ok, actions, start + legal.argmax(1))
        return actions


# --------------------------------------------------------------------------- agents -> policies
def agent_to_policy(cfg: RunConfig, agent: str) -> str:
    """The policy an agent acts for: ``multiagent.policy_mapping_fn``, else the first pattern of
    ``multiagent.policy_mapping`` that matches, else a run's one policy (a single-agent run's one agent
    acts for ``default_policy``)."""
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
    ids = list(policy_configs(cfg))
    if not ma.policy_mapping and len(ids) == 1:
        return ids[0]
    written = ", ".join(f"{pid}: {pats}" for pid, pats in ma.policy_mapping.items()) or "none"
    raise ConfigError(f"multiagent.policy_mapping: no pattern covers agent '{agent}' ({written}); add one, "
                      "e.g. '*' to the last policy")


def map_agents(cfg: RunConfig, spaces_of: Mapping[str, tuple[gym.Space, gym.Space]]
               ) -> tuple[dict[str, str], dict[str, tuple[gym.Space, gym.Space]]]:
    """``{agent: (obs space, action space)}`` -> agent -> policy id, and policy id -> its agents'
    spaces; raises ConfigError if agents sharing a policy have different spaces, or a policy has no agent."""
    mapping: dict[str, str] = {}
    spaces: dict[str, tuple[gym.Space, gym.Space]] = {}
    first: dict[str, str] = {}
    for agent, pair in spaces_of.items():
        pid = agent_to_policy(cfg, agent)
        mapping[agent] = pid
        if pid not in spaces:
            spaces[pid], first[pid] = pair, agent
        elif pair[0] != spaces[pid][0] or pair[1] != spaces[pid][1]:
            raise ConfigError(
                f"multiagent.policy_mapping: agents '{first[pid]}' and '{agent}' share policy '{pid}' but their spaces "
                f"differ ({spaces[pid][0]}, {spaces[pid][1]} vs {pair[0]}, {pair[1]}); map them to different policies")
    unused = [pid for pid in policy_configs(cfg) if pid not in spaces]
    if unused:
        raise ConfigError(f"multiagent.policies: no agent of {cfg.env.id} is mapped to {', '.join(unused)} "
                          f"(agents: {', '.join(spaces_of)})")
    _check_seat_keys(cfg, list(spaces_of))
    for pid, (src, _) in snapshots(cfg).items():  # its source's weights must fit its agents
        if spaces[pid][0] != spaces[src][0] or spaces[pid][1] != spaces[src][1]:
            raise ConfigError(f"multiagent.policies.{pid}.snapshot_of: its agents' spaces ({spaces[pid][0]}, "
                              f"{spaces[pid][1]}) differ from '{src}''s ({spaces[src][0]}, {spaces[src][1]})")
    return mapping, spaces


def _check_seat_keys(cfg: RunConfig, agents: list[str]) -> None:
    """A ``stop`` key or the ``objective`` that names a seat (``eval/<policy>/seat/<seat>/...``) names one
    of the env's agents."""
    for where, key in [*((f"stop.{k}", k) for k in cfg.stop), ("objective", cfg.objective)]:
        seat = seat_metric(key)
        if seat is not None and seat[1] not in agents:
            raise ConfigError(f"{where}: seat '{seat[1]}' is not one of {cfg.env.id}'s agents ({', '.join(agents)})"
                              f"{suggest(seat[1], agents)}")


def copy_spaces(cfg: RunConfig, copies: Any) -> tuple[dict[str, str], dict[str, tuple[gym.Space, gym.Space]]]:
    """``map_agents`` for env copies (``rlrun/envs/copies.py``): agent -> policy, policy -> spaces."""
    return map_agents(cfg, copy_agent_spaces(copies))


def run_spaces(cfg: RunConfig, probe: bool = False) -> dict[str, tuple[gym.Space, gym.Space]]:
    """``{policy_id: (obs space, action space)}`` of a run: a single-agent run's ``default_policy`` has
    its env's spaces (declared, or of one env copy); a multi-agent run's policies have those of the
    agents mapped to them. ``probe``: the env is reset and stepped once first, its API checked (before
    compute, one line on a mistake)."""
    return map_agents(cfg, agent_spaces(cfg.env, probe, cfg.seed))[1]
