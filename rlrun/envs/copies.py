"""A run's env copies as the rollout worker samples them: one interface for single- and multi-agent envs.

The interface is the multi-agent vector env's (``rlrun/envs/multi_agent.py``): ``possible_agents``,
``observation_space(agent)``, ``action_space(agent)``, ``reset(seed) -> (obs, acting)`` and
``step(actions) -> VectorStep``, every value a dict keyed by agent id of arrays over the copies. A
single-agent env is the case of one agent (``OneAgentEnv``): its copies are the sub-envs of a gymnasium
vector env, whose next-step autoreset is exactly the multi-agent rule (a copy whose episode ended is
reset on the next step, in which no agent acts and whose reward counts for nothing). Single-agent
observations keep their dtype (uint8 frames stay uint8); only multi-agent ones go through ``ObsAdapter``.

This module is where rlrun tells single- from multi-agent envs apart: ``env_copies`` (the copies a worker
or an evaluation samples), ``render_copy`` (one copy that renders frames) and ``agent_spaces`` (each
agent's spaces, probed before a run starts). Everything above it sees agents and copies only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.config.multi_agent import is_multi_agent_env
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError
from rlrun.core.registry import ENVS, RegistryError
from rlrun.envs.action_mask import MASK_KEY, pack_action_mask
from rlrun.envs.make import check_env_id, env_from_config, env_spaces, make_vector_env, probe_env_config
from rlrun.envs.multi_agent import (
    Games,
    ObsAdapter,
    ParallelEnvs,
    VectorStep,
    make_multi_agent_env,
    make_vector_multi_agent_env,
)
from rlrun.envs.seats import check_seats
from rlrun.envs.wrappers import parse_wrappers, wrap_env

AGENT = "agent_0"  # the one agent of a single-agent env


class OneAgentEnv:
    """A gymnasium vector env as a vector env of one agent. ``infos``: the vector env's batched infos of
    the last reset or step (what single-agent callbacks see)."""

    one_agent = True
    possible_agents = [AGENT]

    def __init__(self, vector_env: gym.vector.VectorEnv) -> None:
        self.vector_env = vector_env
        self.num_envs = int(vector_env.num_envs)
        self.metadata = vector_env.metadata
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
        return VectorStep({AGENT: obs}, {AGENT: rew}, {AGENT: term}, {AGENT: trunc}, {AGENT: acting}, stepped, end,
                          self._games(end))

    def _games(self, end: np.ndarray) -> Games | None:
        """The games that ended, where a wrapper (episodic_life) says ``game_over`` in its info."""
        infos = self.infos
        if "game_over" not in infos:
            return None
        over = end & np.asarray(infos["_game_over"], bool)
        over[over] = np.asarray(infos["game_over"])[over].astype(bool)  # an object array where an env gave np.bool_
        returns, lengths = np.zeros(len(end)), np.zeros(len(end), np.int64)
        if over.any():
            if "game_return" not in infos or "game_length" not in infos:
                raise PluginError("env: its info says game_over without game_return and game_length (the game's "
                                  "score and steps, as the episodic_life wrapper gives them)")
            returns[over] = np.asarray(infos["game_return"])[over].astype(np.float64)
            lengths[over] = np.asarray(infos["game_length"])[over].astype(np.int64)
        return Games(over, returns, lengths)

    def render(self) -> Any:
        """The first sub-env's frame (``render_copy``: the env renders ``rgb_array`` frames)."""
        frames = self.vector_env.render()
        assert frames is not None
        return frames[0]

    def close(self) -> None:
        self.vector_env.close()


def env_copies(env: Any, num_envs: int, rotate_seats: bool = False) -> Any:
    """``num_envs`` copies of the configured env (an ``EnvConfig``) behind the multi-agent vector interface
    (``rotate_seats``: with ``env.shuffle_seats``, the seats in rotation, as evaluation plays them)."""
    if is_multi_agent_env(env.id):
        return make_vector_multi_agent_env(env.id, num_envs, env.kwargs, env.vectorize, env.shuffle_seats,
                                           rotate_seats)
    return OneAgentEnv(env_from_config(env, num_envs))


def copy_agent_spaces(copies: Any) -> dict[str, tuple[gym.Space, gym.Space]]:
    """``{agent: (obs space, action space)}`` of env copies, as they present them."""
    return {a: (copies.observation_space(a), copies.action_space(a)) for a in copies.possible_agents}


def render_copy(env: Any) -> Any:
    """One copy of the configured env that renders ``rgb_array`` frames (``rlrun-eval render=true``): a
    gymnasium id, a plain rlrun env entry, or a multi-agent env that takes ``render_mode``; with the
    run's ``env.wrappers``."""
    if is_multi_agent_env(env.id):
        kwargs = {**env.kwargs, "render_mode": "rgb_array"}
        return ParallelEnvs([make_multi_agent_env(env.id, kwargs, env.shuffle_seats)])
    if env.id in ENVS:
        entry = ENVS.entry(env.id)
        if entry.info.get("vector", True):
            raise RegistryError(f"env.id: rlrun env '{env.id}' is a vector env; render needs a gymnasium id "
                                "or an env registered with vector=False that accepts render_mode")
        one = wrap_env(entry.obj(render_mode="rgb_array", **env.kwargs), parse_wrappers(env.wrappers))
    elif env.vectorize == "envpool":  # EnvPool renders the pool's frames itself
        return OneAgentEnv(make_vector_env(env.id, 1, {**env.kwargs, "render_mode": "rgb_array"}, "envpool",
                                           env.wrappers))
    else:
        check_env_id(env.id)  # imports the package of a MiniGrid id
        one = wrap_env(gym.make(env.id, render_mode="rgb_array", **env.kwargs), parse_wrappers(env.wrappers))
    return OneAgentEnv(pack_action_mask(gym.vector.SyncVectorEnv([lambda: one])))


def agent_spaces(env: Any, probe: bool = False, seed: int = 0) -> dict[str, tuple[gym.Space, gym.Space]]:
    """``{agent: (obs space, action space)}`` as the copies present them (declared spaces, or of one
    copy built for the purpose). ``probe``: the copy is reset and stepped first, and a mistake in the
    env's API is one line (``PluginError``) before anything starts."""
    if not is_multi_agent_env(env.id):
        if probe:
            return {AGENT: probe_env_config(env)}
        return {AGENT: env_spaces(env)}
    if not probe:
        copies = env_copies(env, 1)
        try:
            return copy_agent_spaces(copies)
        finally:
            copies.close()
    return _probe_multi_agent(env, seed)


def _legal(adapter: ObsAdapter, obs: Any) -> np.ndarray | None:
    """The legal actions' mask of an agent's observation that carries one (a random probe step takes
    a legal action), else None."""
    return None if adapter.masked is None or obs is None else np.asarray(obs[MASK_KEY], np.int8)


def _probe_multi_agent(env: Any, seed: int) -> dict[str, tuple[gym.Space, gym.Space]]:
    try:
        one = make_multi_agent_env(env.id, env.kwargs)  # its own API first, then its seats
    except (RegistryError, ConfigError):
        raise
    except Exception as e:
        raise PluginError(f"env.id: creating {env.id} with {env.kwargs or {}} failed: "
                          f"{type(e).__name__}: {e}") from None
    try:
        adapters = {a: ObsAdapter(one.observation_space(a), one.action_space(a)) for a in one.possible_agents}
        obs, _ = one.reset(seed=seed)
        for agent, o in obs.items():
            adapters[agent](o)
        out = one.step({a: one.action_space(a).sample(mask=_legal(adapters[a], obs.get(a))) for a in one.agents})
        if len(out) != 5 or not all(isinstance(d, dict) for d in out):
            raise PluginError(f"env.id: {env.id}.step() must return 5 dicts keyed by agent id "
                              "(obs, rewards, terminateds, truncateds, infos)")
        if env.shuffle_seats:
            check_seats(one, env.id)
        return {a: (ad.space, one.action_space(a)) for a, ad in adapters.items()}
    finally:
        one.close()
