"""Reading rlrun Parquet files for training: checked up front, streamed, postprocessed, shuffled.

Before any compute every file's footer is read (a truncated file is refused), its metadata and
columns are checked against what the run needs and its spaces against the env's, and its rewards
are scanned for NaN/inf. Then rows stream in chunks of ``chunk_rows`` (memory stays bounded by the
shuffle buffer plus one chunk, however large the dataset), are cut into episode pieces (an episode
that continues into the next chunk waits for it), postprocessed by the learner's policy exactly as
a rollout worker's fragment would be (GAE, n-step, MARWIL returns), and go to a shuffle buffer from
which each train batch is drawn at random. Files are read in a new random order on every pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlrun.core.errors import first_line
from rlrun.data.batch import SampleBatch, concat_samples
from rlrun.data.parquet import REQUIRED_COLUMNS, DataError, batch_from_table, read_meta
from rlrun.data.postprocessing import postprocess_episodes
from rlrun.data.spaces import same_space, space_from_json, space_to_json

SB = SampleBatch


def check_file(path: Path, needed: Sequence[str], obs_space: gym.Space, action_space: gym.Space) -> dict[str, Any]:
    """One file's metadata, after checking its footer, columns, spaces and rewards (DataError otherwise)."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({first_line(e)}); was it cut short?") from None
    meta = read_meta(path, pf.schema_arrow)
    names = set(pf.schema_arrow.names)
    for col in needed:
        if col not in names:
            raise DataError(f"{path}: column '{col}' is missing (the file has {', '.join(sorted(names))})")
    for key, space in (("observation_space", obs_space), ("action_space", action_space)):
        try:
            theirs = space_from_json(meta[key])
        except (KeyError, ValueError, TypeError) as e:
            raise DataError(f"{path}: metadata '{key}' is missing or invalid ({first_line(e)})") from None
        if not same_space(theirs, space):
            raise DataError(f"{path}: {key} {space_to_json(theirs)} does not match the env's {space_to_json(space)}")
    columns = meta.get("columns", {})
    for col, space in ((SB.OBS, obs_space), (SB.NEXT_OBS, obs_space), (SB.ACTIONS, action_space)):
        shape = tuple(columns.get(col, {}).get("shape", ()))
        if col in names and shape != tuple(space.shape or ()):
            raise DataError(f"{path}: column '{col}' has rows of shape {list(shape)}, the env's space has "
                            f"{list(space.shape or ())}")
    try:
        rewards = batch_from_table(pq.read_table(path, columns=[SB.REWARDS]), columns, str(path))[SB.REWARDS]
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: cannot read column 'rewards' ({first_line(e)})") from None
    bad = np.flatnonzero(~np.isfinite(rewards.astype(np.float64)))
    if len(bad):
        raise DataError(f"{path}: column 'rewards' has {len(bad)} non-finite value(s) (first at row {bad[0]}: "
                        f"{rewards[bad[0]]})")
    return meta


class ShuffledReader:
    """Train batches through a shuffle buffer from a stream of episode pieces (``_pieces``), each
    postprocessed by the learner's policy as a rollout worker's fragment would be."""

    def __init__(self, policy: Any, shuffle_buffer: int = 10_000, seed: int = 0) -> None:
        self.policy = policy
        self.shuffle_buffer = shuffle_buffer
        self.rng = np.random.default_rng(seed)
        self.rows_read = 0
        self.passes = 0
        self._stream: Iterator[SampleBatch] | None = None
        self._buf: SampleBatch | None = None

    def _pieces(self) -> Iterator[SampleBatch]:
        raise NotImplementedError

    def next_batch(self, n: int) -> SampleBatch:
        """``n`` rows drawn at random from the shuffle buffer (in stream order when it holds 1 row)."""
        if self._stream is None:
            self._stream = self._pieces()
        want = max(n, self.shuffle_buffer)
        parts = [self._buf] if self._buf is not None and len(self._buf) else []
        have = sum(len(p) for p in parts)
        while have < want:
            piece = next(self._stream)
            parts.append(piece)
            have += len(piece)
        buf = parts[0] if len(parts) == 1 else concat_samples(_common(parts))
        take = np.arange(n) if self.shuffle_buffer <= 1 else self.rng.choice(len(buf), size=n, replace=False)
        keep = np.ones(len(buf), dtype=bool)
        keep[take] = False
        self._buf = buf.slice(keep)
        return buf.slice(take)

    def _postprocess(self, rows: SampleBatch) -> SampleBatch:
        self.rows_read += len(rows)
        return postprocess_episodes(self.policy, rows)

    def metrics(self) -> dict[str, float]:
        return {"offline/rows_read": float(self.rows_read), "offline/passes": float(self.passes)}


class ParquetReader(ShuffledReader):
    """rlrun Parquet files, checked up front, read a chunk at a time in a new file order every pass."""

    def __init__(self, files: Sequence[Path], policy: Any, obs_space: gym.Space, action_space: gym.Space,
                 shuffle_buffer: int = 10_000, seed: int = 0, chunk_rows: int = 8192) -> None:
        super().__init__(policy, shuffle_buffer, seed)
        self.files = list(files)
        self.needed = [*REQUIRED_COLUMNS, *([SB.NEXT_OBS] if policy.needs_next_obs else [])]
        self.meta = {p: check_file(p, self.needed, obs_space, action_space) for p in self.files}
        self.chunk_rows = chunk_rows

    def _pieces(self) -> Iterator[SampleBatch]:
        while True:
            for i in self.rng.permutation(len(self.files)):
                yield from self._file_pieces(self.files[i])
            self.passes += 1

    def _file_pieces(self, path: Path) -> Iterator[SampleBatch]:
        """Postprocessed rows of one file, a chunk at a time; an episode cut by the chunk waits for the rest."""
        columns = self.meta[path].get("columns", {})
        carry: SampleBatch | None = None
        try:
            for rb in pq.ParquetFile(path).iter_batches(batch_size=self.chunk_rows):
                chunk = batch_from_table(rb, columns, str(path))
                self._check_finite(path, chunk)
                if carry is not None:
                    chunk = concat_samples([carry, chunk])
                ids = chunk[SB.EPS_ID]
                ended = bool(chunk[SB.TERMINATEDS][-1] or chunk[SB.TRUNCATEDS][-1])
                k = len(ids) if ended else int(np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])[-1])
                carry = chunk.slice(slice(k, None)) if k < len(ids) else None
                if k:
                    yield self._postprocess(chunk.slice(slice(0, k)))
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: cannot be read ({first_line(e)})") from None
        if carry is not None:
            yield self._postprocess(carry)

    def _check_finite(self, path: Path, chunk: SampleBatch) -> None:
        for col in (SB.OBS, SB.NEXT_OBS):
            v = chunk.get(col)
            if v is not None and v.dtype.kind == "f" and not np.isfinite(v).all():
                raise DataError(f"{path}: column '{col}' holds NaN or infinite values")


def _common(parts: list[SampleBatch]) -> list[SampleBatch]:
    """The columns every part has (files recorded with and without postprocessed columns mix)."""
    keys = set(parts[0]).intersection(*parts[1:])
    if all(len(p) == len(keys) for p in parts):
        return parts
    return [SampleBatch({k: p[k] for k in keys}) for p in parts]
