"""Gymnasium spaces <-> plain JSON data, for a dataset's metadata (never pickled)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def space_to_json(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _bound(space.low), "high": _bound(space.high)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    raise ValueError(f"cannot record a {type(space).__name__} space")


def _bound(a: np.ndarray) -> Any:
    """A Box bound as JSON: one number when every entry is equal; infinities as strings."""
    flat = np.asarray(a, dtype=np.float64).ravel()
    values = [v if np.isfinite(v) else ("inf" if v > 0 else "-inf") for v in flat.tolist()]
    return values[0] if len(set(map(str, values))) == 1 else values


def space_from_json(data: dict[str, Any]) -> gym.Space:
    kind = data.get("type")
    if kind == "Discrete":
        return gym.spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
    if kind == "Box":
        shape = tuple(int(s) for s in data["shape"])
        low = np.asarray(data["low"], dtype=np.float64)
        high = np.asarray(data["high"], dtype=np.float64)
        dtype = np.dtype(data["dtype"])
        return gym.spaces.Box(np.broadcast_to(low, shape).astype(dtype), np.broadcast_to(high, shape).astype(dtype),
                              shape=shape, dtype=dtype)
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(np.asarray(data["nvec"]))
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(data["n"])
    raise ValueError(f"unknown space type {kind!r}")


def same_space(a: gym.Space, b: gym.Space) -> bool:
    """Same kind, shape and dtype (and n for discrete spaces); bounds may differ."""
    if type(a) is not type(b) or a.shape != b.shape:
        return False
    if isinstance(a, gym.spaces.Discrete):
        return bool(a.n == b.n)  # type: ignore[attr-defined]
    return a.dtype == b.dtype
