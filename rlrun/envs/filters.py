"""Observation filters (``rollout.observation_filter``): ``none`` or ``mean_std``.

``mean_std`` keeps running per-element statistics of every observation a worker sees and feeds the
policy ``clip((obs - mean) / std, -clip, clip)``. Each Policy owns its filter, so training, greedy
evaluation, ``rlrun-eval``, checkpoints and the exported MLflow model use the same statistics.

Sync across Ray workers (as RLlib does it): a worker also counts what it saw since its last report
(its *delta*); the learner merges every worker's delta into its own filter each iteration and sends
the merged statistics back with the weights; a worker then takes them plus what it saw since its
report. Evaluation never updates a filter (frozen statistics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

FILTERS = ("none", "mean_std")


class RunningStat:
    """Count, mean and sum of squared deviations per element; merged exactly (Chan et al. 1979)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.n = 0.0
        self.mean = np.zeros(shape, np.float64)
        self.m2 = np.zeros(shape, np.float64)

    def push_batch(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64)
        if len(x):
            self.merge(len(x), x.mean(axis=0), ((x - x.mean(axis=0)) ** 2).sum(axis=0))

    def merge(self, n: float, mean: np.ndarray, m2: np.ndarray) -> None:
        if n <= 0:
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.n * n / total)
        self.n = total

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / self.n) if self.n > 1 else np.ones_like(self.mean)

    def state(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean.copy(), "m2": self.m2.copy()}

    def load(self, state: Mapping[str, Any]) -> None:
        self.n = float(state["n"])
        self.mean = np.asarray(state["mean"], np.float64).copy()
        self.m2 = np.asarray(state["m2"], np.float64).copy()


class NoFilter:
    """Observations pass unchanged."""

    active = False

    def __call__(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        return obs

    def pop_delta(self) -> dict[str, Any] | None:
        return None

    def apply_delta(self, delta: Mapping[str, Any]) -> None:
        pass

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        pass

    def sync(self, state: Mapping[str, Any]) -> None:
        pass


class MeanStdFilter(NoFilter):
    """Running mean/std normalisation, clipped to ``[-clip, clip]``; float32 out."""

    active = True

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        self.shape = shape
        self.clip = float(clip)
        self.rs = RunningStat(shape)
        self.delta = RunningStat(shape)  # seen since the last pop_delta (what the learner has not merged)
        self._refresh()

    def _refresh(self) -> None:
        self._mean = self.rs.mean.astype(np.float32)
        self._inv_std = (1.0 / (self.rs.std + 1e-8)).astype(np.float32)

    def __call__(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        if update:
            self.rs.push_batch(obs)
            self.delta.push_batch(obs)
            self._refresh()
        out = (np.asarray(obs, np.float32) - self._mean) * self._inv_std
        return np.clip(out, -self.clip, self.clip, out=out)

    def pop_delta(self) -> dict[str, Any] | None:
        out = self.delta.state()
        self.delta = RunningStat(self.shape)
        return out if out["n"] > 0 else None

    def apply_delta(self, delta: Mapping[str, Any]) -> None:
        self.rs.merge(float(delta["n"]), np.asarray(delta["mean"]), np.asarray(delta["m2"]))
        self._refresh()

    def get_state(self) -> dict[str, Any]:
        """Tensors and numbers only (checkpoints load with ``weights_only=True``)."""
        s = self.rs.state()
        return {"n": s["n"], "mean": torch.from_numpy(s["mean"]), "m2": torch.from_numpy(s["m2"]), "clip": self.clip}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore exactly these statistics (a checkpoint); nothing is left to report."""
        if not state:
            return
        self.rs.load({k: np.asarray(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()})
        self.delta = RunningStat(self.shape)
        self._refresh()

    def sync(self, state: Mapping[str, Any]) -> None:
        """A worker: take the learner's merged statistics, plus what this copy saw since its last
        ``pop_delta`` (still to be reported, so it is kept)."""
        delta = self.delta
        self.set_state(state)
        self.delta = delta
        self.rs.merge(delta.n, delta.mean, delta.m2)
        self._refresh()

    def affine(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, 1 / std) as float32: what an exported model applies to raw observations."""
        return self._mean.copy(), self._inv_std.copy()


def make_filter(name: str, shape: tuple[int, ...], clip: float = 10.0) -> NoFilter:
    if name == "none":
        return NoFilter()
    if name == "mean_std":
        return MeanStdFilter(shape, clip)
    raise ValueError(f"rollout.observation_filter: unknown filter '{name}' (known: {', '.join(FILTERS)})")
