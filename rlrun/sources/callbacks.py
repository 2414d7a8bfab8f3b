"""Callbacks: user code called at fixed points of sampling and training, and custom metrics.

Subclass ``Callbacks``, register it (``@CALLBACKS.register("my_callbacks")`` in a ``plugins:``
module) and list it in YAML: ``callbacks: [my_callbacks]``. Hooks are called with keyword arguments
only, so a hook may take just the ones it needs plus ``**kwargs``:

- ``on_episode_start(worker, episode, env_index)`` after the env reset the sub-env;
- ``on_episode_step(worker, episode, env_index)`` after each step of the episode;
- ``on_episode_end(worker, episode, env_index)`` when it terminated or was truncated;
- ``on_postprocess_trajectory(worker, policy_id, policy, postprocessed_batch)`` on each fragment after
  the policy's postprocessing (advantages, value targets); change its columns in place to customise
  sample collection;
- ``on_sample_end(worker, samples)`` on the batch a worker's ``sample()`` returns;
- ``on_train_result(trainer, result)`` on the learner after each iteration (add keys to ``result``).

``episode.custom_metrics[name] = value`` (set in any episode hook) is averaged over the episodes that
ended in an iteration and logged as ``custom/<name>_mean``, ``_min`` and ``_max``; an iteration in
which no episode ended reports none. A hook that raises stops the run with one line naming the
callback and the hook. Callbacks run on every rollout worker, Ray actors included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlrun.core.errors import PluginError, one_line
from rlrun.core.metrics import mean_min_max
from rlrun.core.registry import CALLBACKS

HOOKS = ("on_episode_start", "on_episode_step", "on_episode_end", "on_postprocess_trajectory", "on_sample_end",
         "on_train_result")


class CallbackError(PluginError):
    """A user callback raised: the run stops (one line: the callback, the hook, the error)."""


@dataclass
class Episode:
    """One sub-env's running episode as callbacks see it. Observations are the env's raw ones
    (before any observation filter); ``last_info`` is the env's info dict of the last step (or reset)."""

    episode_id: int
    env_index: int
    last_observation: Any = None
    last_info: dict[str, Any] = field(default_factory=dict)
    last_action: Any = None
    last_reward: float = 0.0
    length: int = 0
    total_reward: float = 0.0
    user_data: dict[str, Any] = field(default_factory=dict)  # anything a callback keeps between hooks
    custom_metrics: dict[str, float] = field(default_factory=dict)  # reported as custom/<name>_mean|min|max


class Callbacks:
    """Base class: every hook does nothing. Override the ones you need (keyword arguments only)."""

    def on_episode_start(self, *, worker: Any, episode: Episode, env_index: int, **kwargs: Any) -> None:
        pass

    def on_episode_step(self, *, worker: Any, episode: Episode, env_index: int, **kwargs: Any) -> None:
        pass

    def on_episode_end(self, *, worker: Any, episode: Episode, env_index: int, **kwargs: Any) -> None:
        pass

    def on_postprocess_trajectory(self, *, worker: Any, policy_id: str, policy: Any, postprocessed_batch: Any,
                                  **kwargs: Any) -> None:
        pass

    def on_sample_end(self, *, worker: Any, samples: Any, **kwargs: Any) -> None:
        pass

    def on_train_result(self, *, trainer: Any, result: dict[str, float], **kwargs: Any) -> None:
        pass


class CallbackList:
    """The run's callbacks (``callbacks: [...]``), each hook called on each of them in order."""

    def __init__(self, names: Sequence[str]) -> None:
        self.items: list[tuple[str, Any]] = []
        for i, name in enumerate(names):
            cls = CALLBACKS.get(name, f"callbacks[{i}]")
            try:
                self.items.append((name, cls()))
            except Exception as e:
                raise CallbackError(f"callbacks[{i}]: creating '{name}' failed: {one_line(e)}") from None

    def __bool__(self) -> bool:
        return bool(self.items)

    def call(self, hook: str, **kwargs: Any) -> None:
        for name, cb in self.items:
            try:
                getattr(cb, hook)(**kwargs)
            except Exception as e:
                if os.environ.get("RLRUN_TRACEBACK"):
                    raise
                raise CallbackError(f"callbacks: '{name}' raised in {hook}: {one_line(e)}") from None


def env_info(infos: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Sub-env ``i``'s info dict out of a gymnasium vector env's batched infos (arrays plus ``_key`` masks)."""
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if k.startswith("_"):
            continue
        mask = infos.get(f"_{k}")
        if mask is not None and not mask[i]:
            continue
        out[k] = env_info(v, i) if isinstance(v, Mapping) else v[i]
    return out


def custom_metric_summary(values: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``{name: [per-episode values]}`` -> ``custom/<name>_mean``, ``_min``, ``_max`` (names with no
    finite value are left out, never reported as 0)."""
    out: dict[str, float] = {}
    for name, vals in values.items():
        v = np.asarray(vals, dtype=np.float64)
        if np.isfinite(v).any():
            out.update(mean_min_max(f"custom/{name}", v[np.isfinite(v)]))
    return out


class EpisodeTracker:
    """A single-agent worker's episodes for its callbacks: one ``Episode`` per sub-env, advanced with
    each vector step (next-step autoreset: a sub-env's row after its episode ended starts the next)."""

    def __init__(self, callbacks: CallbackList, worker: Any) -> None:
        self.callbacks = callbacks
        self.worker = worker
        self.episodes: list[Episode] = []
        self.custom: dict[str, list[float]] = {}

    def reset(self, obs: np.ndarray, infos: Mapping[str, Any], eps_ids: np.ndarray) -> None:
        self.episodes = [self._start(obs, infos, eps_ids, i) for i in range(len(obs))]

    def _start(self, obs: np.ndarray, infos: Mapping[str, Any], eps_ids: np.ndarray, i: int) -> Episode:
        ep = Episode(int(eps_ids[i]), i, obs[i], env_info(infos, i))
        self.callbacks.call("on_episode_start", worker=self.worker, episode=ep, env_index=i)
        return ep

    def step(self, actions: np.ndarray, next_obs: np.ndarray, rewards: np.ndarray, done: np.ndarray,
             valid: np.ndarray, infos: Mapping[str, Any], eps_ids: np.ndarray) -> None:
        """After a vector step (``eps_ids``: the ids after the step, so a finished sub-env's next episode)."""
        for i, ep in enumerate(self.episodes):
            if not valid[i]:  # the dummy autoreset step: the next episode's first observation
                self.episodes[i] = self._start(next_obs, infos, eps_ids, i)
                continue
            ep.last_observation, ep.last_info, ep.last_action = next_obs[i], env_info(infos, i), actions[i]
            ep.last_reward = float(rewards[i])
            ep.length += 1
            ep.total_reward += ep.last_reward
            self.callbacks.call("on_episode_step", worker=self.worker, episode=ep, env_index=i)
            if done[i]:
                self.callbacks.call("on_episode_end", worker=self.worker, episode=ep, env_index=i)
                for k, v in ep.custom_metrics.items():
                    self.custom.setdefault(k, []).append(float(v))

    def pop_custom(self) -> dict[str, list[float]]:
        out, self.custom = self.custom, {}
        return out
