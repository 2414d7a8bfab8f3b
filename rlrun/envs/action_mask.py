"""Envs whose observations carry an action mask, as RLlib's ActionMaskEnv (and PettingZoo's envs) give
them: a ``Dict`` with an ``action_mask`` entry (``n`` zeros and ones, 1 = legal, for a ``Discrete(n)``
action space) and one other entry, the observation itself.

rlrun packs such an observation into one float32 vector, the mask first (``MaskedBox``,
rlrun/data/spaces.py), so it travels through buffers, Ray, datasets and the policy server as any Box
does; the policy's model reads the mask back and gives illegal actions no probability
(rlrun/models/action_mask.py). Nothing to configure: an env with this observation space is packed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.core.errors import PluginError
from rlrun.data.spaces import MaskedBox

MASK_KEY = "action_mask"


def masked_space(space: gym.Space, action_space: gym.Space, where: str = "env.id") -> MaskedBox | None:
    """The packed space of an action-masked ``Dict`` observation; None for any other space. A Dict with
    an ``action_mask`` that cannot be packed gets one line naming ``where`` and what is wrong."""
    if not isinstance(space, gym.spaces.Dict) or MASK_KEY not in space.spaces:
        return None
    rest = [k for k in space.spaces if k != MASK_KEY]
    mask, inner = space.spaces[MASK_KEY], space.spaces[rest[0]] if len(rest) == 1 else None
    problem = None
    if not isinstance(action_space, gym.spaces.Discrete):
        problem = f"takes a Discrete action space; the env's is {action_space}"
    elif len(rest) != 1:
        problem = f"takes one observation beside '{MASK_KEY}'; the Dict has {rest or 'none'}"
    elif not isinstance(mask, gym.spaces.Box | gym.spaces.MultiBinary) or mask.shape != (int(action_space.n),):
        problem = f"'{MASK_KEY}' must be {int(action_space.n)} zeros and ones (one per action); it is {mask}"
    elif not isinstance(inner, gym.spaces.Box | gym.spaces.Discrete):
        problem = f"'{rest[0]}' must be a Box or Discrete observation; it is {inner}"
    if problem:
        raise PluginError(f"{where}: an observation with an action mask {problem}")
    assert isinstance(action_space, gym.spaces.Discrete)
    n = int(action_space.n)
    if isinstance(inner, gym.spaces.Discrete):  # one-hot, as multi-agent runs encode Discrete observations
        return MaskedBox(gym.spaces.Box(0.0, 1.0, (int(inner.n),), np.float32), n, rest[0])
    assert isinstance(inner, gym.spaces.Box)
    return MaskedBox(inner, n, rest[0])


def pack(space: MaskedBox, inner: gym.Space, obs: dict[str, Any], batch: bool) -> np.ndarray:
    """One Dict observation (``batch``: a vector env's, ``[C, ...]`` per entry) -> ``[(C,) n + d]``;
    ``inner``: the env's own space of the observation entry (a Discrete one is one-hot encoded)."""
    mask = np.asarray(obs[MASK_KEY], dtype=np.float32)
    raw = obs[space.key]
    if isinstance(inner, gym.spaces.Discrete):
        idx = np.asarray(raw, dtype=np.int64) - int(inner.start)
        raw = np.eye(int(inner.n), dtype=np.float32)[idx]
    return _concat(mask, np.asarray(raw, dtype=np.float32), batch)


def _concat(mask: np.ndarray, x: np.ndarray, rows: bool) -> np.ndarray:
    """The packed vector of a float32 mask and observation (``rows``: N of each -> ``[N, n + d]``)."""
    if rows:
        return np.concatenate([mask.reshape(len(mask), -1), x.reshape(len(x), -1)], axis=1)
    return np.concatenate([mask.ravel(), x.ravel()])


def packed_rows(observations: Any) -> Any:
    """``packed`` for N observations: a Dict of ``[N, ...]`` entries (a vector env's), or N of them (an
    array ``[N, ...]`` as it is)."""
    if isinstance(observations, np.ndarray):
        return observations
    return packed(observations, rows=True) if isinstance(observations, Mapping) else [packed(o) for o in observations]


def packed(obs: Any, rows: bool = False) -> Any:
    """A policy client's observation: a Dict with an action mask -> the packed vector (its other entry a
    Box observation, flattened; ``rows``: entries ``[N, ...]``, N vectors); anything else as it is."""
    if not isinstance(obs, Mapping) or MASK_KEY not in obs:
        return obs
    rest = [k for k in obs if k != MASK_KEY]
    if len(rest) != 1:
        raise ValueError(f"observation: a Dict with an action mask takes one other entry, got {rest}")
    return _concat(np.asarray(obs[MASK_KEY], np.float32), np.asarray(obs[rest[0]], np.float32), rows)


def random_legal_actions(rng: np.random.Generator, obs: np.ndarray, obs_space: gym.Space, n: int) -> np.ndarray:
    """One uniformly random action of ``n`` (from 0) per row of ``obs``: among the legal ones where the
    observations carry an action mask (epsilon-greedy exploration, the ``random`` heuristic)."""
    if not isinstance(obs_space, MaskedBox):
        return rng.integers(0, n, len(obs))
    return np.where(obs_space.legal(obs), rng.random((len(obs), obs_space.mask_size)), -1.0).argmax(1)


def probe_actions(env: gym.vector.VectorEnv, obs: np.ndarray) -> np.ndarray:
    """Uniformly random actions for a vector env's copies (an env probe's); legal ones where its
    observations carry a mask."""
    space, act = env.single_observation_space, env.single_action_space
    if not isinstance(space, MaskedBox) or not isinstance(act, gym.spaces.Discrete):
        return np.asarray(env.action_space.sample())
    return int(act.start) + random_legal_actions(np.random.default_rng(), obs, space, int(act.n))


class MaskedVectorEnv(gym.vector.VectorObservationWrapper):
    """A vector env's action-masked Dict observations, packed (``MaskedBox``)."""

    def __init__(self, env: gym.vector.VectorEnv, space: MaskedBox) -> None:
        super().__init__(env)
        source = env.single_observation_space
        assert isinstance(source, gym.spaces.Dict)
        self._inner = source.spaces[space.key]
        self._packed = space
        self.single_observation_space = space
        self.observation_space = gym.vector.utils.batch_space(space, env.num_envs)

    def observations(self, observations: Any) -> Any:
        return pack(self._packed, self._inner, observations, batch=True)


def pack_action_mask(env: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """``env`` with its observations packed when they carry an action mask; else ``env`` itself."""
    space = masked_space(env.single_observation_space, env.single_action_space)
    return env if space is None else MaskedVectorEnv(env, space)
