"""Minari datasets (Farama's offline-RL format) as an ``input`` and as an ``output``.

``input: minari:<dataset id>`` reads a dataset from the local Minari directory (``MINARI_DATASETS_PATH``,
default ``~/.minari/datasets``); rlrun never downloads one. ``output: minari:<dataset id>`` writes the
run's whole episodes as a new Minari dataset (Minari's ``arrow`` format: pyarrow, no h5py), a chunk of
episodes at a time, so recording never holds the whole dataset in memory.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlrun.core.errors import first_line
from rlrun.data.batch import SampleBatch
from rlrun.data.parquet import DataError, DatasetWriter
from rlrun.data.reader import ShuffledReader
from rlrun.data.spaces import MaskedBox, same_space, space_to_json

SB = SampleBatch
PREFIX = "minari:"


def dataset_id(source: str) -> str:
    return source[len(PREFIX):]


def datasets_root() -> Path:
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path())


def load(source: str) -> Any:
    """The local Minari dataset ``minari:<id>``; one line naming the id when there is none."""
    import minari

    did = dataset_id(source)
    try:
        return minari.load_dataset(did, download=False)
    except FileNotFoundError:
        raise DataError(f"input: {source}: no local Minari dataset '{did}' in {datasets_root()} (rlrun never "
                        "downloads one; create it with Minari, or point MINARI_DATASETS_PATH at its directory)") \
            from None
    except (ValueError, KeyError, OSError) as e:
        raise DataError(f"input: {source}: cannot be read as a Minari dataset ({first_line(e)})") from None


def check_minari(source: str, obs_space: gym.Space, action_space: gym.Space) -> Any:
    ds = load(source)
    # a dataset rlrun recorded from an action-masked env holds the packed vector as a plain Box
    seen = obs_space.as_box() if isinstance(obs_space, MaskedBox) else obs_space
    for key, theirs, ours in (("observation_space", ds.observation_space, seen),
                              ("action_space", ds.action_space, action_space)):
        if not isinstance(theirs, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete) or \
                not same_space(theirs, ours):
            raise DataError(f"input: {source}: {key} {theirs} does not match the env's {space_to_json(ours)}")
    return ds


class MinariReader(ShuffledReader):
    """Episodes of a local Minari dataset, in a new random order on every pass."""

    def __init__(self, source: str, policy: Any, obs_space: gym.Space, action_space: gym.Space,
                 shuffle_buffer: int = 10_000, seed: int = 0) -> None:
        super().__init__(policy, shuffle_buffer, seed)
        self.source = source
        self.dataset = check_minari(source, obs_space, action_space)
        self.obs_dtype = obs_space.dtype

    def _pieces(self) -> Iterator[SampleBatch]:
        ds = self.dataset
        while True:
            order = self.rng.permutation(np.asarray(ds.episode_indices))
            for ep in ds.iterate_episodes(order.tolist()):
                yield self._postprocess(self._rows(ep))
            self.passes += 1

    def _rows(self, ep: Any) -> SampleBatch:
        n = len(ep.rewards)
        rewards = np.asarray(ep.rewards, dtype=np.float32)
        if not np.isfinite(rewards).all():
            raise DataError(f"input: {self.source}: episode {ep.id} has NaN or infinite rewards")
        obs = np.asarray(ep.observations)
        if len(obs) != n + 1:
            raise DataError(f"input: {self.source}: episode {ep.id} has {len(obs)} observations for {n} steps "
                            f"(Minari stores steps + 1)")
        out = SampleBatch()
        for k, v in ((SB.OBS, obs[:-1]), (SB.NEXT_OBS, obs[1:]), (SB.ACTIONS, np.asarray(ep.actions)),
                     (SB.REWARDS, rewards), (SB.TERMINATEDS, np.asarray(ep.terminations, dtype=bool)),
                     (SB.TRUNCATEDS, np.asarray(ep.truncations, dtype=bool)),
                     (SB.EPS_ID, np.full(n, int(ep.id), dtype=np.int64)), (SB.T, np.arange(n, dtype=np.int64))):
            dict.__setitem__(out, k, v)
        return out


class MinariWriter(DatasetWriter):
    """Whole episodes into a new Minari dataset (episodes still running at the end are left out)."""

    def __init__(self, source: str, meta: Mapping[str, Any], env_id: str, obs_space: gym.Space,
                 action_space: gym.Space, file_size_mb: float = 64.0, max_episodes: int | None = None) -> None:
        self.source = source
        self.dataset_id = dataset_id(source)
        self.env_id = env_id
        self.spaces = (obs_space, action_space)
        self.dataset: Any = None
        super().__init__(datasets_root(), meta, file_size_mb, None, True, max_episodes)

    def _emit(self, rows: SampleBatch, episodes: int) -> None:
        from minari.data_collector import EpisodeBuffer

        buffers = [EpisodeBuffer(
            observations=np.concatenate([e[SB.OBS], e[SB.NEXT_OBS][-1:]]), actions=e[SB.ACTIONS],
            rewards=e[SB.REWARDS].astype(np.float64), terminations=e[SB.TERMINATEDS], truncations=e[SB.TRUNCATEDS],
            infos={},
        ) for e in rows.split_by_episode()]
        if self.dataset is None:
            self.dataset = create(self.dataset_id, buffers, self.env_id, *self.spaces, str(self.meta.get("algo")))
        else:
            self.dataset.update_dataset_from_buffer(buffers)
        self.rows_written += len(rows)
        self.episodes_written += episodes

    def close(self, keep_running: bool = True) -> list[Path]:
        return super().close(keep_running=False)


def create(did: str, buffers: Sequence[Any], env_id: str, obs_space: gym.Space, action_space: gym.Space,
           algo: str) -> Any:
    import minari

    env: Any = env_id if env_id in gym.registry else None
    with warnings.catch_warnings():  # Minari asks for an author, e-mail and code link in four warnings
        warnings.simplefilter("ignore", UserWarning)
        return minari.create_dataset_from_buffers(
            did, list(buffers), env=env, observation_space=obs_space, action_space=action_space,
            algorithm_name=f"rlrun {algo}", data_format="arrow", description="recorded by rlrun",
        )


def check_output(source: str) -> None:
    """``output: minari:<id>``: a well-formed id that no local dataset has yet."""
    from minari.dataset.minari_dataset import parse_dataset_id

    from rlrun.config.typed import ConfigError

    did = dataset_id(source)
    try:
        parse_dataset_id(did)
    except ValueError:
        raise ConfigError(f"output: '{source}': Minari ids look like [namespace/]name-v<version>, e.g. "
                          "minari:cartpole/ppo-v0") from None
    if (datasets_root() / did).exists():
        raise ConfigError(f"output: '{source}': a Minari dataset '{did}' already exists in {datasets_root()}")
    os.makedirs(datasets_root(), exist_ok=True)
