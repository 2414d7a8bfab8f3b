"""``env.vectorize: envpool``: sub-envs stepped by EnvPool's C++ thread pool instead of Python.

EnvPool (``pip install envpool``, optional) implements CartPole, Pendulum, MountainCar, Acrobot,
Atari, MuJoCo and more in C++; its gymnasium interface already autoresets on the step *after* an
episode ends, which is gymnasium's next-step mode that rlrun's sampler expects (rlrun/sources/rollout_worker.py).
This adapter gives the pool the ``gymnasium.vector.VectorEnv`` face the sampler uses: seeding on
``reset(seed=...)`` (EnvPool takes its seed when the pool is made, so a seeded reset makes a new
pool), batched spaces, and float64 rewards like gymnasium's own vector envs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.core.errors import first_line, suggest
from rlrun.core.registry import RegistryError

INSTALL = "pip install envpool (or pip install -e '.[envpool]')"


def _envpool() -> Any:
    """``import envpool``, which otherwise creates ``/tmp/envpool-jumanji-matplotlib`` and points
    ``MPLCONFIGDIR`` there: matplotlib keeps its usual per-user directory instead."""
    if "MPLCONFIGDIR" not in os.environ and "ENVPOOL_JUMANJI_MPLCONFIGDIR" not in os.environ:
        import matplotlib

        os.environ["ENVPOOL_JUMANJI_MPLCONFIGDIR"] = matplotlib.get_configdir()
    import envpool

    return envpool


@contextlib.contextmanager
def _quiet_spaces() -> Iterator[None]:
    """EnvPool builds gymnasium Boxes from float64 bounds when it makes a pool and on its first reset;
    gymnasium warns about each (harmless: the observations are float32)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@functools.cache
def envpool_ids() -> tuple[str, ...]:
    """EnvPool's ~1,600 ids, listed once per process (every pool construction checks its id)."""
    return tuple(sorted(_envpool().list_all_envs()))


def check_envpool_id(env_id: str) -> None:
    """One line naming the id and the package when EnvPool is missing or does not have ``env_id``."""
    try:
        ids = envpool_ids()
    except ImportError:
        raise RegistryError(f"env.vectorize: envpool needs the envpool package, which is not installed; {INSTALL}, "
                            "or use env.vectorize=auto") from None
    if env_id not in ids:
        shared = [i for i in ids if i in gym.registry]  # the ids a gymnasium user knows, of its 1,600
        raise RegistryError(f"env.vectorize: envpool has no env '{env_id}'{suggest(env_id, ids)}; it has "
                            f"{', '.join(shared[:12])}, ... (or use env.vectorize=auto)")


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of EnvPool's ``env_id`` as a gymnasium vector env (next-step autoreset)."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None) -> None:
        check_envpool_id(env_id)
        # one pool thread unless env.kwargs says otherwise: CartPole x 64 on this 2-core machine steps
        # at 389k/s on one thread, 255k/s on two and 214k/s with EnvPool's default (one per core)
        self.env_id, self.num_envs, self._given = env_id, num_envs, dict(kwargs or {})
        self._kwargs = {"num_threads": 1, **self._given}
        self._pool = self._make(0)
        with _quiet_spaces():
            self.single_observation_space = self._pool.observation_space
            self.single_action_space = self._pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.render_mode = self._given.get("render_mode")
        self._act_dtype = self.single_action_space.dtype
        # EnvPool's Atari episodic_life ends an episode at each lost life, as rlrun's episodic_life wrapper does:
        # the games' score is summed here and reported with EnvPool's step count at each game's end (its info's
        # "terminated"), so the episode statistics are whole games, as with the wrapper
        self._game_returns = np.zeros(num_envs) if self._kwargs.get("episodic_life") else None

    def _make(self, seed: int) -> Any:
        envpool = _envpool()
        try:
            with _quiet_spaces():
                return envpool.make(self.env_id, env_type="gymnasium", num_envs=self.num_envs, seed=seed,
                                    **self._kwargs)
        except (TypeError, ValueError, RuntimeError) as e:  # unknown or bad kwargs
            raise RegistryError(f"env.kwargs: envpool's {self.env_id} rejected {self._given}: "
                              f"{first_line(e)}") from None

    def reset(self, *, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self._pool.close()
            self._pool = self._make(int(seed if isinstance(seed, int) else seed[0]))
        with _quiet_spaces():
            obs, _ = self._pool.reset()
        if self._game_returns is not None:
            self._game_returns[:] = 0.0
        return obs, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rew, term, trunc, info = self._pool.step(np.asarray(actions, dtype=self._act_dtype))
        return obs, rew.astype(np.float64), term, trunc, self._games(info, trunc)

    def _games(self, info: dict[str, Any], trunc: np.ndarray) -> dict[str, Any]:
        """rlrun's game keys (``wrappers.GAME_KEYS``) where EnvPool's episodic_life is on, else nothing."""
        returns = self._game_returns
        if returns is None:
            return {}
        returns += info["reward"]  # the game's own score (0 on an autoreset step), clipped or not for learning
        over = info["terminated"].astype(bool) | trunc  # the last life lost, or the frame cap
        game = {"game_over": over, "game_return": returns.copy(), "game_length": info["elapsed_step"].copy()}
        returns[over] = 0.0
        every = np.ones(self.num_envs, dtype=bool)
        return {**game, **{f"_{k}": every for k in game}}

    def render(self) -> Any:
        """The copies' frames (``env.kwargs.render_mode: rgb_array``, as ``rlrun-eval render=true`` sets it)."""
        return self._pool.render()

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()
