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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlrun.core.errors import DataError as DataError  # re-exported
from rlrun.core.errors import first_line
from rlrun.data.batch import SampleBatch, concat_samples

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
        flat = _to_arrow(v.reshape(-1))
        arrays.append(flat if v.ndim == 1 else pa.FixedSizeListArray.from_arrays(flat, int(np.prod(v.shape[1:]))))
        names.append(name)
    info = {**meta, "format": FORMAT, "version": VERSION, "columns": columns}
    return pa.Table.from_arrays(arrays, names=names, metadata={META_KEY: json.dumps(info).encode()})


# numpy <-> Arrow through the buffers: pyarrow's own conversions import pandas (0.6 s) on first use
NUMPY_TYPES = {pa.bool_(): np.bool_, pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32,
               pa.int64(): np.int64, pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32,
               pa.uint64(): np.uint64, pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}


def _to_arrow(v: np.ndarray) -> pa.Array:
    if v.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(v), [None, pa.py_buffer(np.packbits(v, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v), [None, pa.py_buffer(v)])


def _to_numpy(arr: pa.Array) -> np.ndarray:
    """A numeric or boolean Arrow array without nulls -> a writable numpy copy."""
    if arr.null_count:
        raise ValueError(f"{arr.null_count} missing value(s)")
    dtype = NUMPY_TYPES.get(arr.type)
    if dtype is None:
        raise ValueError(f"Arrow type {arr.type} is not a number")
    n, off = len(arr), arr.offset
    if dtype is np.bool_:
        bits = np.frombuffer(arr.buffers()[1], np.uint8)
        return np.unpackbits(bits, count=off + n, bitorder="little")[off:].astype(bool)
    size = np.dtype(dtype).itemsize
    return np.frombuffer(arr.buffers()[1], dtype, count=n, offset=off * size).copy()


def batch_from_table(table: pa.Table | pa.RecordBatch, columns: Mapping[str, Any], where: str = "") -> SampleBatch:
    """Inverse of ``table_from_batch`` for the columns in ``table`` (shapes from ``columns``);
    DataError naming ``where`` and the column for missing values or non-numeric columns."""
    out = SampleBatch()
    for name in table.column_names:
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        spec = columns.get(name, {"shape": [], "dtype": None})
        shape = tuple(spec["shape"])
        try:
            if shape:
                if not isinstance(col, pa.FixedSizeListArray):
                    raise ValueError(f"Arrow type {col.type} is not a fixed-size list")
                v = _to_numpy(col.flatten()).reshape(len(col), *shape)
            else:
                v = _to_numpy(col)
        except ValueError as e:
            raise DataError(f"{where or 'data'}: column '{name}': {e}") from None
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
            raise DataError(f"{path}: not a readable Parquet file ({first_line(e)})") from None
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


class DatasetWriter:
    """Writes batches to ``directory`` as Parquet files of about ``file_size_mb`` each.

    ``by_episode``: rows are held until their episode ends, so every file holds whole episodes, each
    one's rows contiguous (ordered by episode id); episodes still running at a flush wait for the next
    file. A multi-agent policy's batches, whose agents share episode ids, are written as they come.
    ``max_episodes``: record that many whole episodes, then ignore what comes. Per batch the writer
    only appends and notes which episodes ended (vectorised work at flush time): splitting every
    batch by episode cost 30% of sampling throughput on CartPole.
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
        self._held: list[SampleBatch] = []
        self._held_bytes = 0
        self._ended: list[int] = []  # ids of the held episodes that have ended
        self._prefix = f"part-{socket.gethostname()}-{os.getpid()}-{id(self) & 0xFFFF:04x}"

    @property
    def full(self) -> bool:
        """``max_episodes`` whole episodes are recorded (written or ready to be)."""
        return self.max_episodes is not None and self.episodes_written + len(self._ended) >= self.max_episodes

    def write(self, batch: SampleBatch) -> None:
        batch = self._select(batch)
        if not len(batch) or self.full:
            return
        self._held.append(batch)
        self._held_bytes += sum(v.nbytes for v in batch.values())
        if self.by_episode:
            ended = batch[SB.EPS_ID][batch[SB.TERMINATEDS] | batch[SB.TRUNCATEDS]].tolist()
            if self.max_episodes is not None:
                ended = ended[: self.max_episodes - self.episodes_written - len(self._ended)]
            self._ended.extend(ended)
        if self._held_bytes >= self.limit:
            self.flush()

    def _select(self, batch: SampleBatch) -> SampleBatch:
        out = SampleBatch()
        for k, v in batch.items():
            if (self.columns is None or k in self.columns) and not k.startswith("state_"):
                dict.__setitem__(out, k, v)
        if SB.ACTION_LOGP in out and ACTION_PROB not in out:
            dict.__setitem__(out, ACTION_PROB, np.exp(out[SB.ACTION_LOGP]))
        return out

    def flush(self, running: bool = False) -> None:
        """Write the ended episodes held (``running``: every held row) as one file."""
        if not self._held:
            return
        rows = concat_samples(self._held)
        self._held, self._held_bytes = [], 0
        if not self.by_episode:
            self._emit(rows, 0)
            return
        done = np.isin(rows[SB.EPS_ID], np.asarray(self._ended, dtype=np.int64))
        out = rows if running else rows.slice(done)
        if not running and not done.all():
            rest = rows.slice(~done)
            self._held, self._held_bytes = [rest], sum(v.nbytes for v in rest.values())
        if len(out):
            out = out.slice(np.argsort(out[SB.EPS_ID], kind="stable"))  # each episode contiguous, in time order
            ids, first, counts = np.unique(out[SB.EPS_ID], return_index=True, return_counts=True)
            whole = np.isin(ids, self._ended)
            returns = np.add.reduceat(out[SB.REWARDS].astype(np.float64), first)
            self.episode_returns += returns[whole].tolist()
            self.episode_lengths += counts[whole].tolist()
            self._emit(out, int(whole.sum()))
        self._ended = []

    def _emit(self, rows: SampleBatch, episodes: int) -> None:
        path = self.directory / f"{self._prefix}-{len(self.files):05d}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        # no dictionary encoding: float columns gain nothing from it, and it was 3/4 of the write time
        # (104,599 CartPole rows: 260 ms and 6.5 MB with it, 70 ms and 4.9 MB without)
        pq.write_table(table_from_batch(rows, self.meta), tmp, compression="zstd", use_dictionary=False)
        os.replace(tmp, path)
        self.files.append(path)
        self.rows_written += len(rows)
        self.episodes_written += episodes

    def close(self, keep_running: bool = True) -> list[Path]:
        """Write the rest; episodes still running are written too unless ``keep_running`` is False
        (or ``max_episodes`` were recorded)."""
        self.flush(running=keep_running and self.max_episodes is None)
        self._held = []
        return self.files
