"""Saving episodes that rlrun did not sample (a simulator, logs, another library) as rlrun data.

    with EpisodeWriter("data/external", env.observation_space, env.action_space, env_id="CartPole-v1") as w:
        w.add_step(obs, action, reward, terminated, truncated, next_obs)   # every step; ends at term/trunc

Each finished episode is written as rlrun Parquet (``input=data/external`` reads it); pass
``action_prob`` (the behaviour policy's probability of the action) for off-policy estimation.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.core.version import __version__
from rlrun.data.batch import SampleBatch
from rlrun.data.parquet import ACTION_PROB, DatasetWriter
from rlrun.data.spaces import space_to_json

SB = SampleBatch


class EpisodeWriter:
    def __init__(self, directory: str | Path, observation_space: gym.Space, action_space: gym.Space,
                 env_id: str = "", file_size_mb: float = 64.0) -> None:
        meta = {"rlrun_version": __version__, "env_id": env_id, "policy_id": "default_policy", "algo": "external",
                "explore": True, "observation_space": space_to_json(observation_space),
                "action_space": space_to_json(action_space)}
        self.spaces = (observation_space, action_space)
        self.writer = DatasetWriter(directory, meta, file_size_mb)
        self.episodes = 0
        self._steps: list[tuple[Any, ...]] = []

    def add_step(self, obs: Any, action: Any, reward: float, terminated: bool, truncated: bool, next_obs: Any,
                 action_prob: float | None = None) -> None:
        """One step; the episode is written when ``terminated`` or ``truncated``."""
        self._steps.append((obs, action, reward, terminated, truncated, next_obs, action_prob))
        if terminated or truncated:
            self._flush_episode()

    def _flush_episode(self) -> None:
        obs_space, act_space = self.spaces
        obs, act, rew, term, trunc, nxt, prob = zip(*self._steps, strict=True)
        n = len(obs)
        batch = SampleBatch({
            SB.OBS: np.asarray(obs, dtype=obs_space.dtype), SB.NEXT_OBS: np.asarray(nxt, dtype=obs_space.dtype),
            SB.ACTIONS: np.asarray(act, dtype=np.int64 if isinstance(act_space, gym.spaces.Discrete) else np.float32),
            SB.REWARDS: np.asarray(rew, dtype=np.float32), SB.TERMINATEDS: np.asarray(term, dtype=bool),
            SB.TRUNCATEDS: np.asarray(trunc, dtype=bool), SB.EPS_ID: np.full(n, self.episodes, dtype=np.int64),
            SB.T: np.arange(n, dtype=np.int64),
        })
        if all(p is not None for p in prob):
            batch[ACTION_PROB] = np.asarray(prob, dtype=np.float32)
            batch[SB.ACTION_LOGP] = np.log(batch[ACTION_PROB])
        self.writer.write(batch)
        self.episodes += 1
        self._steps = []

    def close(self) -> list[Path]:
        """Write what is held; an unfinished episode is written as it is (a reader bootstraps it)."""
        if self._steps:
            self._flush_episode()
        return self.writer.close()

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
