"""Environment creation: registered env names or any gymnasium id, always as a vector env.

An ENVS entry is a callable ``(num_envs: int, **kwargs) -> gymnasium.vector.VectorEnv`` (or a plain
``(**kwargs) -> gymnasium.Env`` registered with ``vector=False``, which rlrun wraps in a
SyncVectorEnv). Vector envs must use gymnasium's default next-step autoreset; see workers.py.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlrun.registry import ENVS, RegistryError, suggest


def check_env_id(env_id: str) -> None:
    """Fail with known names if ``env_id`` is neither registered with rlrun nor with gymnasium."""
    if env_id in ENVS or env_id in gym.registry:
        return
    gym_ids = sorted(gym.registry)
    known = ENVS.names() + gym_ids
    raise RegistryError(
        f"env.id: unknown env '{env_id}'{suggest(env_id, known)}. rlrun envs: "
        f"{', '.join(ENVS.names()) or '(none)'}; gymnasium ids include {', '.join(gym_ids[:12])}, ... "
        "(a plugin module may register more: `plugins: [my_envs]`)"
    )


def make_vector_env(
    env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None, vectorize: str = "auto"
) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies of ``env_id`` stepped as one vector env.

    ``vectorize='auto'`` uses the env's own numpy-vectorised implementation when gymnasium has one
    (CartPole-v1: ~10x faster than stepping Python envs in a loop) and a SyncVectorEnv otherwise.
    """
    kwargs = dict(kwargs or {})
    check_env_id(env_id)
    if env_id in ENVS:
        entry = ENVS.entry(env_id)
        if entry.info.get("vector", True):
            return entry.obj(num_envs, **kwargs)
        creator = entry.obj
        return gym.vector.SyncVectorEnv([lambda: creator(**kwargs) for _ in range(num_envs)])
    spec = gym.spec(env_id)
    mode = vectorize
    if mode == "auto":
        mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **kwargs)
    except TypeError as e:
        raise RegistryError(f"env.kwargs: {env_id} rejected {kwargs}: {e}") from None
