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
``pettingzoo:pettingzoo.classic.rps_v2`` or ``pettingzoo:mpe2.simple_spread_v3``. An AEC env whose
players take turns (the classic board games: not parallelizable) is played through ``TurnBasedEnv``
(``rlrun/envs/turn_based.py``).

Observations reach policies as float32 arrays: ``Discrete(n)`` observations are one-hot encoded.

Vector envs: many copies of a multi-agent env stepped as one, the interface the rollout worker samples
from. ``reset(seed) -> (obs, acting)`` and ``step(actions) -> VectorStep``, with every value a dict keyed
by agent id of arrays over the ``num_envs`` copies (``[C, ...]``). Like gymnasium's vector envs, a
copy whose episode ended is reset on the *next* step (``stepped`` is False there and no agent of it
acted), so that the final observations stay readable for one step: an agent that left keeps its
final observation in ``obs`` until its copy is reset.

Two implementations: ``ParallelEnvs`` steps C PettingZoo-style Parallel envs one by one (any
multi-agent env), and an env registered with a ``vector=`` factory steps all copies at once in numpy
(``multi_cartpole``: ``VectorMultiCartPole``; at 64 copies ~4x the agent steps/s of ParallelEnvs,
see experiments/multi_agent_throughput). ``env.vectorize: sync`` forces ParallelEnvs.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlrun.config.extras import EXTRA_OF, install_hint
from rlrun.config.multi_agent import PETTINGZOO
from rlrun.config.typed import ConfigError
from rlrun.core.errors import PluginError
from rlrun.core.registry import ENVS, RegistryError
from rlrun.envs.action_mask import masked_space, pack
from rlrun.envs.seats import SeatShuffle
from rlrun.envs.turn_based import TurnBasedEnv, is_turn_based


# --------------------------------------------------------------------------- envs
class ObsAdapter:
    """Turns one agent's observations into float32 arrays (``Discrete(n)``: one-hot; a Dict with an
    ``action_mask``: packed, rlrun/envs/action_mask.py)."""

    def __init__(self, space: gym.Space, action_space: gym.Space | None = None) -> None:
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.masked = masked_space(space, action_space) if action_space is not None else None
        self.space: gym.Space
        if self.masked is not None:
            assert isinstance(space, gym.spaces.Dict)
            self.source = space.spaces[self.masked.key]
            self.space = self.masked
        elif isinstance(space, gym.spaces.Discrete):
            self.n, self.start = int(space.n), int(space.start)
            self.space = gym.spaces.Box(0.0, 1.0, (self.n,), np.float32)
        elif isinstance(space, gym.spaces.Box):
            self.space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape,
                                        np.float32)
        else:
            raise PluginError(f"env.id: observation space {space} is not supported for multi-agent runs yet "
                              "(Box and Discrete are)")

    def __call__(self, obs: Any) -> np.ndarray:
        if self.masked is not None:
            return pack(self.masked, self.source, obs, batch=False)
        if self.discrete:
            out = np.zeros(self.n, np.float32)
            out[int(obs) - self.start] = 1.0
            return out
        return np.asarray(obs, dtype=np.float32)


def make_multi_agent_env(env_id: str | None, kwargs: dict[str, Any] | None = None, shuffle_seats: bool = False,
                         rotate_from: int | None = None) -> Any:
    """One multi-agent env (Parallel API) from a registered name or a ``pettingzoo:<module>`` id;
    ``shuffle_seats``: its agents change seats every episode (``rlrun/envs/seats.py``; ``rotate_from``:
    in rotation, as evaluation copies do, not at random)."""
    env = _make_multi_agent_env(env_id, kwargs)
    return SeatShuffle(env, str(env_id), rotate_from) if shuffle_seats else env


def _make_multi_agent_env(env_id: str | None, kwargs: dict[str, Any] | None) -> Any:
    if env_id is None:
        raise ConfigError("multiagent: a multi-agent run needs its env (env.id is null)")
    kwargs = dict(kwargs or {})
    if env_id.startswith(PETTINGZOO):
        module_name = env_id[len(PETTINGZOO):]
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            missing = getattr(e, "name", None) or module_name
            fix = f"; {install_hint(missing)}" if missing.split(".", 1)[0] in EXTRA_OF else ""
            raise RegistryError(f"env.id: cannot import '{module_name}' for {env_id}: {e}{fix}") from None
        try:
            if hasattr(module, "parallel_env"):
                return module.parallel_env(**kwargs)
            if hasattr(module, "env"):
                return _from_aec(module.env(**kwargs))
        except TypeError as e:
            raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None
        raise RegistryError(f"env.id: module '{module_name}' has neither parallel_env() nor env() (PettingZoo's API)")
    entry = ENVS.entry(env_id, "env.id")
    try:
        env = entry.obj(**kwargs)
    except TypeError as e:
        raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None
    return _from_aec(env) if is_turn_based(env) else env


def _from_aec(aec: Any) -> Any:
    """An AEC env as a Parallel one: PettingZoo's ``aec_to_parallel`` where its players move at once
    (parallelizable), else turn by turn (``TurnBasedEnv``)."""
    if not aec.metadata.get("is_parallelizable", False):  # players take turns
        return TurnBasedEnv(aec)
    from pettingzoo.utils.conversions import aec_to_parallel

    return aec_to_parallel(aec)


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


# --------------------------------------------------------------------------- vector envs
class VectorStep(NamedTuple):
    obs: dict[str, np.ndarray]  # [C, *obs_shape] float32: the next observation (final one for a departed agent)
    rewards: dict[str, np.ndarray]  # [C] float32 (a turn-based game: a waiting player's too, e.g. the loser's -1)
    terminateds: dict[str, np.ndarray]  # [C] bool
    truncateds: dict[str, np.ndarray]  # [C] bool; an agent that left without a flag counts as truncated
    acting: dict[str, np.ndarray]  # [C] bool: the agent acts in the next step
    stepped: np.ndarray  # [C] bool: False where the copy was reset instead of stepped
    episode_end: np.ndarray  # [C] bool: no agent left after this step (the copy resets next step)
    # whole games where learning episodes end inside one (the episodic_life wrapper, whose info says
    # game_over): the episode statistics are the games'; None: the episodes' own
    game: Games | None = None


class Games(NamedTuple):
    """The games that ended in a step, as the env counted them (hidden steps, such as a reset's no-op, too)."""

    end: np.ndarray  # [C] bool
    returns: np.ndarray  # [C] float64, where end
    lengths: np.ndarray  # [C] int64, where end


def make_vector_multi_agent_env(env_id: str | None, num_envs: int, kwargs: dict[str, Any] | None = None,
                                vectorize: str = "auto", shuffle_seats: bool = False, rotate: bool = False) -> Any:
    """``num_envs`` copies as one vector env; ``shuffle_seats`` (``rotate``: the seats in rotation, copy c
    from shift c) makes them ``ParallelEnvs`` of ``SeatShuffle`` copies, even for an env with a vector form."""
    if env_id is None:
        return make_multi_agent_env(env_id)  # refuses it
    kwargs = dict(kwargs or {})
    vector = ENVS.entry(env_id).info.get("vector") if env_id in ENVS else None
    if vector is not None and vectorize != "sync" and not shuffle_seats:  # seats shuffle in ParallelEnvs' copies
        try:
            return vector(num_envs, **kwargs)
        except TypeError as e:
            raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None
    return ParallelEnvs([make_multi_agent_env(env_id, kwargs, shuffle_seats, c if rotate else None)
                         for c in range(num_envs)])


class ParallelEnvs:
    """C Parallel-API envs as one vector env (observations through ``ObsAdapter``: float32, one-hot)."""

    def __init__(self, envs: list[Any]) -> None:
        self.envs = envs
        self.num_envs = len(envs)
        self.metadata = getattr(envs[0], "metadata", {})
        self.possible_agents = list(envs[0].possible_agents)
        # players take turns (rlrun/envs/turn_based.py): the worker credits waiting players and samples whole games
        self.turn_based = bool(getattr(envs[0], "turn_based", False))
        self.adapters = {a: ObsAdapter(envs[0].observation_space(a), envs[0].action_space(a))
                         for a in self.possible_agents}
        n = self.num_envs
        self._obs = {a: np.zeros((n, *ad.space.shape), np.float32) for a, ad in self.adapters.items()}  # type: ignore[misc]
        self._acting = {a: np.zeros(n, bool) for a in self.possible_agents}
        self._pending = np.zeros(n, bool)

    def observation_space(self, agent: str) -> gym.Space:
        return self.adapters[agent].space

    def action_space(self, agent: str) -> gym.Space:
        return self.envs[0].action_space(agent)

    def _reset_copy(self, c: int, seed: int | None) -> None:
        obs, _ = self.envs[c].reset(seed=seed)
        for a in self.possible_agents:
            self._acting[a][c] = a in obs
        for a, o in obs.items():
            self._obs[a][c] = self.adapters[a](o)

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        for c in range(self.num_envs):
            self._reset_copy(c, None if seed is None else seed + c)
        self._pending[:] = False
        return {a: o.copy() for a, o in self._obs.items()}, {a: m.copy() for a, m in self._acting.items()}

    def step(self, actions: Mapping[str, np.ndarray]) -> VectorStep:
        n, agents = self.num_envs, self.possible_agents
        rew = {a: np.zeros(n, np.float32) for a in agents}
        term = {a: np.zeros(n, bool) for a in agents}
        trunc = {a: np.zeros(n, bool) for a in agents}
        stepped = ~self._pending
        end = np.zeros(n, bool)
        for c in range(n):
            if self._pending[c]:
                self._reset_copy(c, None)
                continue
            env = self.envs[c]
            acted = list(env.agents)
            playing = list(env.live_agents) if self.turn_based else acted  # a turn-based game: waiting ones too
            next_obs, rewards, terms, truncs, _ = env.step({a: actions[a][c] for a in acted})
            for a, r in rewards.items():
                rew[a][c] = r
            for a, o in next_obs.items():
                self._obs[a][c] = self.adapters[a](o)
            still = env.live_agents if self.turn_based else env.agents
            for a in playing:
                term[a][c] = bool(terms.get(a, False))
                trunc[a][c] = not term[a][c] and (bool(truncs.get(a, False)) or a not in still)
            for a in agents:
                self._acting[a][c] = a in env.agents
            end[c] = not env.agents
        self._pending = end.copy()
        return VectorStep({a: o.copy() for a, o in self._obs.items()}, rew, term, trunc,
                          {a: m.copy() for a, m in self._acting.items()}, stepped, end)

    def seats(self, c: int) -> dict[str, str] | None:
        """Copy ``c``'s seats in its current (or just ended) episode, agent -> the env's agent it plays, where its
        seats are shuffled (``env.shuffle_seats``), else None."""
        env = self.envs[c]
        return env.seat_of if isinstance(env, SeatShuffle) else None

    def render(self) -> Any:
        """The first copy's frame (an env made with ``render_mode='rgb_array'``)."""
        return self.envs[0].render()

    def close(self) -> None:
        for env in self.envs:
            env.close()


class VectorMultiCartPole:
    """``num_envs`` copies of ``multi_cartpole`` in numpy (CartPole-v1's dynamics, gymnasium 1.x):
    agent i of every copy is one pole; a fallen (terminated) or 500-step (truncated) pole waits,
    frozen, until every pole of its copy is done; then the copy resets on the next step."""

    GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    X_LIMIT, THETA_LIMIT, MAX_STEPS = 2.4, 12 * 2 * np.pi / 360, 500

    def __init__(self, num_envs: int, num_agents: int = 4) -> None:
        self.num_envs = num_envs
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        high = np.array([self.X_LIMIT * 2, np.finfo(np.float32).max, self.THETA_LIMIT * 2, np.finfo(np.float32).max],
                        dtype=np.float32)
        self._obs_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self._action_space = gym.spaces.Discrete(2)
        self.state = np.zeros((num_envs, num_agents, 4))
        self.alive = np.zeros((num_envs, num_agents), bool)
        self.steps = np.zeros((num_envs, num_agents), np.int64)
        self._pending = np.zeros(num_envs, bool)
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def _split(self, arr: np.ndarray) -> dict[str, np.ndarray]:
        return {a: arr[:, i] for i, a in enumerate(self.possible_agents)}

    def _reset_copies(self, copies: np.ndarray) -> None:
        self.state[copies] = self._rng.uniform(-0.05, 0.05, (int(copies.sum()), len(self.possible_agents), 4))
        self.alive[copies] = True
        self.steps[copies] = 0

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if seed is not None:  # reset() without a seed (complete_episodes) continues the generator
            self._rng = np.random.default_rng(seed)
        self._reset_copies(np.ones(self.num_envs, bool))
        self._pending[:] = False
        return self._split(self.state.astype(np.float32)), self._split(self.alive.copy())

    def step(self, actions: Mapping[str, np.ndarray]) -> VectorStep:
        act = np.stack([np.asarray(actions[a]) for a in self.possible_agents], axis=1)  # [C, N]
        moving = self.alive & ~self._pending[:, None]
        x, x_dot, theta, theta_dot = np.moveaxis(self.state, -1, 0)
        force = np.where(act == 1, self.FORCE, -self.FORCE)
        cos, sin = np.cos(theta), np.sin(theta)
        total, pml = self.MASSCART + self.MASSPOLE, self.MASSPOLE * self.LENGTH
        temp = (force + pml * theta_dot**2 * sin) / total
        theta_acc = (self.GRAVITY * sin - cos * temp) / (self.LENGTH * (4.0 / 3.0 - self.MASSPOLE * cos**2 / total))
        x_acc = temp - pml * theta_acc * cos / total
        new = np.stack([x + self.TAU * x_dot, x_dot + self.TAU * x_acc, theta + self.TAU * theta_dot,
                        theta_dot + self.TAU * theta_acc], axis=-1)
        self.state = np.where(moving[..., None], new, self.state)
        self.steps += moving
        x, theta = self.state[..., 0], self.state[..., 2]
        fell = (np.abs(x) > self.X_LIMIT) | (np.abs(theta) > self.THETA_LIMIT)
        term = moving & fell
        trunc = moving & ~fell & (self.steps >= self.MAX_STEPS)
        rew = moving.astype(np.float32)
        self.alive &= ~(term | trunc)
        stepped = ~self._pending
        if self._pending.any():
            self._reset_copies(self._pending)
        end = stepped & ~self.alive.any(axis=1)
        self._pending = end.copy()
        return VectorStep(self._split(self.state.astype(np.float32)), self._split(rew), self._split(term),
                          self._split(trunc), self._split(self.alive & ~end[:, None]), stepped, end)

    def close(self) -> None:
        pass


# one env for evaluation, rendering and checks (Parallel API), all copies at once for sampling
ENVS.add("multi_cartpole", MultiCartPole, multi_agent=True, vector=VectorMultiCartPole)
