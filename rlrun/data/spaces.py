"""Gymnasium spaces <-> plain JSON data, for a dataset's metadata (never pickled), and ``MaskedBox``: an
observation that carries its action mask."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class MaskedBox(gym.spaces.Box):
    """An env's ``Dict(action_mask=Box(0, 1, (n,)), <obs key>=Box)`` observation as one float32 vector:
    the mask's ``n`` entries (1: the action is legal), then the observation's, flattened. Every column,
    buffer, dataset and network message treats it as the Box it is; the policy's model reads the mask
    back (rlrun/models/action_mask.py). ``inner``: the observation's own Box; ``key``: its Dict key."""

    def __init__(self, inner: gym.spaces.Box, mask_size: int, key: str = "observation") -> None:
        self.inner, self.mask_size, self.key = inner, int(mask_size), key
        low = np.concatenate([np.zeros(mask_size), np.asarray(inner.low, np.float64).ravel()]).astype(np.float32)
        high = np.concatenate([np.ones(mask_size), np.asarray(inner.high, np.float64).ravel()]).astype(np.float32)
        super().__init__(low, high, low.shape, np.float32)

    def legal(self, obs: np.ndarray) -> np.ndarray:
        """Which actions are legal in packed observations ``[N, mask_size + d]``: bool ``[N, mask_size]``."""
        return np.asarray(obs)[:, :self.mask_size] > 0.5

    def as_box(self) -> gym.spaces.Box:
        """The plain Box it is (as a Minari dataset recorded from it stores it)."""
        return gym.spaces.Box(self.low, self.high, self.shape, np.float32)

    def seed(self, seed: Any = None) -> Any:
        seeds = super().seed(seed)
        self.inner.seed(int(self.np_random.integers(2**31)))  # its draws follow this space's seed
        return seeds

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        """A random observation whose mask is zeros and ones with at least one legal action."""
        if mask is not None or probability is not None:
            raise gym.error.Error("MaskedBox.sample takes no mask or probability")
        legal = (self.np_random.random(self.mask_size) < 0.5).astype(np.float32)
        legal[self.np_random.integers(self.mask_size)] = 1.0
        return np.concatenate([legal, np.asarray(self.inner.sample(), np.float32).ravel()])

    def __repr__(self) -> str:
        return f"MaskedBox({self.mask_size} mask entries, {self.key}={self.inner})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MaskedBox) and other.mask_size == self.mask_size and other.inner == self.inner
                and other.key == self.key)


def space_to_json(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, MaskedBox):
        return {"type": "MaskedBox", "mask_size": space.mask_size, "key": space.key,
                "inner": space_to_json(space.inner)}
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
    if kind == "MaskedBox":
        inner = space_from_json(data["inner"])
        assert isinstance(inner, gym.spaces.Box)
        return MaskedBox(inner, int(data["mask_size"]), str(data["key"]))
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
    if isinstance(a, MaskedBox) and isinstance(b, MaskedBox):
        return a.mask_size == b.mask_size and same_space(a.inner, b.inner)
    return a.dtype == b.dtype


BOX_KEYS = {"type", "shape", "low", "high", "dtype"}
SPACE_KEYS = {"Box": BOX_KEYS, "Discrete": {"type", "n", "start"}, "MultiDiscrete": {"type", "nvec"},
              "MultiBinary": {"type", "n"}, "MaskedBox": {"type", "mask_size", "inner", "key"}}


def space_from_config(data: Any, key: str) -> gym.Space:
    """A space declared in YAML (``env.observation_space: {type: Box, shape: [4]}``): the JSON form
    above, with Box bounds defaulting to -inf/inf and dtype to float32. Raises ``ValueError`` whose
    message names ``key`` and the offending value."""
    if not isinstance(data, dict) or data.get("type") not in SPACE_KEYS:
        raise ValueError(f"{key}: expected {{type: Box|Discrete|MultiDiscrete|MultiBinary|MaskedBox, ...}}, got "
                         f"{data!r}")
    unknown = sorted(set(data) - SPACE_KEYS[data["type"]])
    if unknown:
        raise ValueError(f"{key}: unknown key {unknown[0]!r} for a {data['type']} space "
                         f"(keys: {', '.join(sorted(SPACE_KEYS[data['type']]))})")
    full = dict(data)
    if data["type"] == "MaskedBox":  # an action-masked observation: {type: MaskedBox, mask_size: n, inner: <Box>}
        inner = space_from_config(data.get("inner"), f"{key}.inner")
        size, name = data.get("mask_size"), data.get("key", "observation")
        if type(inner) is not gym.spaces.Box or type(size) is not int or size < 1 or not isinstance(name, str):
            raise ValueError(f"{key}: {data!r} is not a valid MaskedBox space (mask_size: a positive integer, "
                             "inner: a Box, key: a name)")
        return MaskedBox(inner, size, name)
    if data["type"] == "Box":
        full = {"low": "-inf", "high": "inf", "dtype": "float32", **data}
    try:
        space = space_from_json(full)
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise ValueError(f"{key}: {data!r} is not a valid {data['type']} space ({what})") from None
    if isinstance(space, gym.spaces.Box) and (np.isnan(space.low).any() or np.isnan(space.high).any()):
        raise ValueError(f"{key}: {data!r}: a Box bound is NaN")
    return space
