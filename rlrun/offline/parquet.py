"""rlrun's offline format: Parquet files of SampleBatch rows, one file per ~``file_size_mb``.

A file holds whole episodes, each one's rows contiguous and in time order (an episode still running
when a writer closes is written as it is: its last row is neither terminated nor truncated, and a
reader bootstraps it like a truncation). Scalar columns are plain Parquet columns; an array column
(``obs`` [N, 4]) is a fixed-size list of its flattened rows, so pandas, polars and DuckDB read the
files without rlrun. The schema metadata key ``rlrun`` (JSON) holds the format version, the spaces,
each column's shape and dtype, the env id and the policy id.

Files are written under a hidden name and renamed when complete, so a reader never sees half a file
(pyarrow.dataset skips names that start with ``.`` or ``_``).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlrun.batch import SampleBatch
from rlrun.errors import DataError as DataError  # re-exported

SB = SampleBatch
FORMAT = "rlrun-offline"
VERSION = 1
META_KEY = b"rlrun"
# what every rlrun file has; a reader refuses a file without one of these
REQUIRED_COLUMNS = (SB.OBS, SB.ACTIONS, SB.REWARDS, SB.TERMINATEDS, SB.TRUNCATEDS, SB.EPS_ID)
ACTION_PROB = "action_prob"  # RLlib's name: exp(action_logp), the behaviour policy's probability


def table_from_batch(batch: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> pa.Table:
    """Numpy columns -> an Arrow table whose metadata records each column's shape and dtype."""
    arrays, names, columns = [], [], {}
    for name, v in batch.items():
        v = np.ascontiguousarray(v)
        if v.dtype == object:
            continue  # infos and other Python objects are not recorded
        columns[name] = {"shape": list(v.shape[1:]), "dtype": str(v.dtype)}
        if v.ndim == 1:
            arrays.append(pa.array(v))
        else:
            width = int(np.prod(v.shape[1:]))
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), width))
        names.append(name)
    info = {**meta, "format": FORMAT, "version": VERSION, "columns": columns}
    return pa.Table.from_arrays(arrays, names=names, metadata={META_KEY: json.dumps(info).encode()})


def batch_from_table(table: pa.Table | pa.RecordBatch, columns: Mapping[str, Any]) -> SampleBatch:
    """Inverse of ``table_from_batch`` for the columns in ``table`` (shapes from ``columns``)."""
    out = SampleBatch()
    for name in table.column_names:
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        spec = columns.get(name, {"shape": [], "dtype": None})
        shape = tuple(spec["shape"])
        if shape:
            flat = col.values.to_numpy(zero_copy_only=False) if col.offset == 0 else \
                col.flatten().to_numpy(zero_copy_only=False)
            v = flat.reshape(len(col), *shape)
        else:
            v = col.to_numpy(zero_copy_only=False)
        if spec["dtype"] is not None:
            v = v.astype(spec["dtype"], copy=False)
        dict.__setitem__(out, name, v)
    return out


def read_meta(path: Path, schema: pa.Schema | None = None) -> dict[str, Any]:
    """The ``rlrun`` metadata of one file; refused (naming the file) when it is not an rlrun file."""
    if schema is None:
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise DataError(f"{path}: a Parquet file without rlrun metadata (key 'rlrun'); record data with "
                        "`rlrun ... output=<dir>`")
    try:
        meta: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise DataError(f"{path}: its rlrun metadata is not JSON") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise DataError(f"{path}: rlrun metadata format {meta.get('format')!r} version {meta.get('version')!r}; "
                        f"this rlrun reads {FORMAT!r} version {VERSION}")
    return meta


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


class DatasetWriter:
    """Writes batches to ``directory`` as Parquet files of about ``file_size_mb`` each.

    ``by_episode``: rows are held back until their episode ends, so every file holds whole episodes
    (at most one running episode per sub-env is held); a multi-agent policy's batches, whose agents
    share episode ids, are written as they come. ``max_episodes``: stop recording after that many.
    """

    def __init__(self, directory: str | Path, meta: Mapping[str, Any], file_size_mb: float = 64.0,
                 columns: Sequence[str] | None = None, by_episode: bool = True,
                 max_episodes: int | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.meta = dict(meta)
        self.limit = int(file_size_mb * 2**20)
        self.columns = tuple(columns) if columns is not None else None
        self.by_episode = by_episode
        self.max_episodes = max_episodes
        self.files: list[Path] = []
        self.rows_written = 0
        self.episodes_written = 0
        self.episode_returns: list[float] = []  # of the whole episodes written (by_episode)
        self.episode_lengths: list[int] = []
        self._pending: dict[int, list[SampleBatch]] = {}  # eps_id -> rows of a running episode
        self._ready: list[SampleBatch] = []
        self._ready_bytes = 0
        self._prefix = f"part-{socket.gethostname()}-{os.getpid()}-{id(self) & 0xFFFF:04x}"

    @property
    def full(self) -> bool:
        """``max_episodes`` whole episodes are recorded (written or ready to be)."""
        return self.max_episodes is not None and len(self.episode_returns) >= self.max_episodes

    def write(self, batch: SampleBatch) -> None:
        batch = self._select(batch)
        if not len(batch) or self.full:
            return
        if not self.by_episode:
            self._add(batch)
            return
        for piece in batch.split_by_episode():
            eid = int(piece[SB.EPS_ID][0])
            parts = self._pending.setdefault(eid, [])
            parts.append(piece)
            if piece[SB.TERMINATEDS][-1] or piece[SB.TRUNCATEDS][-1]:
                del self._pending[eid]
                if not self.full:
                    self._add(parts[0] if len(parts) == 1 else _concat(parts))

    def _select(self, batch: SampleBatch) -> SampleBatch:
        out = SampleBatch()
        for k, v in batch.items():
            if (self.columns is None or k in self.columns) and not k.startswith("state_"):
                dict.__setitem__(out, k, v)
        if SB.ACTION_LOGP in out and ACTION_PROB not in out:
            dict.__setitem__(out, ACTION_PROB, np.exp(out[SB.ACTION_LOGP]))
        return out

    def _add(self, rows: SampleBatch) -> None:
        if self.by_episode:
            self.episode_returns.append(float(rows[SB.REWARDS].sum(dtype=np.float64)))
            self.episode_lengths.append(len(rows))
        self._ready.append(rows)
        self._ready_bytes += sum(v.nbytes for v in rows.values())
        if self._ready_bytes >= self.limit:
            self.flush()

    def flush(self) -> None:
        """Write what is ready as one file."""
        if not self._ready:
            return
        batch = _concat(self._ready)
        episodes = len(self._ready) if self.by_episode else 0
        self._ready, self._ready_bytes = [], 0
        path = self.directory / f"{self._prefix}-{len(self.files):05d}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table_from_batch(batch, self.meta), tmp, compression="zstd")
        os.replace(tmp, path)
        self.files.append(path)
        self.rows_written += len(batch)
        self.episodes_written += episodes

    def close(self, keep_running: bool = True) -> list[Path]:
        """Write the rest; episodes still running are written too unless ``keep_running`` is False."""
        if keep_running and not self.full:
            for parts in self._pending.values():
                self._ready.append(_concat(parts))
        self._pending.clear()
        self.flush()
        return self.files


def _concat(parts: Iterable[SampleBatch]) -> SampleBatch:
    parts = list(parts)
    out = SampleBatch()
    for k in parts[0]:
        dict.__setitem__(out, k, np.concatenate([p[k] for p in parts]))
    return out
