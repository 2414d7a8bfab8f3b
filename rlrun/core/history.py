"""A run's metric history: every iteration's row (metrics, env step, time in ms), appended to a
JSON-lines file in the run's output dir and not held in memory.

An hours-long run keeps its memory flat for it: with every iteration's result dict held in memory
(three times: the run's history, the rows its checkpoints carry and the writer's journal) PPO's
trainer grew ~6 MB/min at ~1,300 iterations a minute (experiments/soak, 2026-11-26). The file is
also a plain record beside the run (``<output_dir>/metrics.jsonl``: one JSON object per iteration, its
metrics plus ``_step`` and ``_timestamp_ms``, so ``pandas.read_json(path, lines=True)`` is a table of
the run), and a checkpoint carries a copy of it as it stood (``history.jsonl``): a resume replays
what MLflow never got, and the file then starts over from the checkpoint's rows.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

MetricRow = tuple[dict[str, float], int, int]  # (metrics, env step, timestamp in ms)
HISTORY_FILE = "metrics.jsonl"
STEP_KEY, TIME_KEY = "_step", "_timestamp_ms"  # beside the metrics in a line (no metric name starts with _)


class HistoryError(ValueError):
    """A history file that is not one row of ``[metrics, step, ms]`` per line."""


class MetricHistory:
    """The run's rows in ``path`` (created, or replaced by ``rows``); ``path=None`` keeps nothing."""

    def __init__(self, path: Path | None, rows: Iterable[MetricRow] = ()) -> None:
        self.path = path
        self._count = 0
        self._file = None
        if path is not None:
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            with open(tmp, "w") as f:
                for row in rows:
                    f.write(_line(*row))
                    self._count += 1
            tmp.replace(path)
            self._file = open(path, "a")  # noqa: SIM115 - appended to for the whole run, closed by close()

    def __len__(self) -> int:
        return self._count

    def append(self, metrics: Mapping[str, float], step: int, timestamp_ms: int) -> None:
        if self._file is not None:
            self._file.write(_line(metrics, step, timestamp_ms))
            self._file.flush()  # a killed run's file holds every iteration it recorded
        self._count += 1

    # append flushes every row, so the file read below is always whole
    def rows(self, start: int = 0) -> Iterator[MetricRow]:
        """The rows from the ``start``-th on, read back from the file."""
        if self.path is None:
            return iter(())
        return (row for i, row in enumerate(read_rows(self.path)) if i >= start)

    def results(self, start: int = 0, keep: Callable[[str], bool] | None = None) -> list[dict[str, float]]:
        """The metrics of the rows from the ``start``-th on (``read_results``)."""
        return read_results(self.path, start, keep)

    def copy_to(self, dest: Path) -> None:
        """The file as it stands now, copied to ``dest`` (a checkpoint's copy)."""
        if self.path is not None:
            shutil.copyfile(self.path, dest)

    def close(self) -> None:
        """No more rows (what the file holds can still be read)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _line(metrics: Mapping[str, float], step: int, timestamp_ms: int) -> str:
    # NaN (no episode finished yet) is kept as Python's json writes it: the row is the iteration's result
    return json.dumps({**metrics, STEP_KEY: int(step), TIME_KEY: int(timestamp_ms)}) + "\n"


def read_results(path: Path | None, start: int = 0,
                 keep: Callable[[str], bool] | None = None) -> list[dict[str, float]]:
    """The metrics of a history file's rows from the ``start``-th on; with ``keep``, only the metrics
    it keeps, but the last row whole (a 30-minute PPO run's 40k whole rows take ~180 MB as dicts)."""
    out: list[dict[str, float]] = []
    last: dict[str, float] = {}
    for i, (last, _, _) in enumerate(read_rows(path) if path is not None else ()):
        if i >= start:
            out.append(last if keep is None else {k: v for k, v in last.items() if keep(k)})
    if out:
        out[-1] = last
    return out


def read_rows(path: Path) -> Iterator[MetricRow]:
    """The rows of a history file: one JSON object per line (metrics, ``_step``, ``_timestamp_ms``), or
    (checkpoints written before 2026-11-26) one JSON list of ``[metrics, step, ms]``. Raises
    ``HistoryError`` naming the line."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                raise HistoryError(f"line {n}: not JSON ({e})") from None
            older = n == 1 and isinstance(value, list) and (not value or isinstance(value[0], list))
            rows = value if older else [value]  # the older format: the whole history as one list of rows
            for row in rows:
                yield _row(row, n)


def _row(value: Any, n: int) -> MetricRow:
    try:
        if isinstance(value, dict):
            metrics = dict(value)
            step, ts = metrics.pop(STEP_KEY), metrics.pop(TIME_KEY)
        else:
            metrics, step, ts = value
        return {str(k): float(v) for k, v in metrics.items()}, int(step), int(ts)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise HistoryError(f"line {n}: not an iteration's metrics with {STEP_KEY} and {TIME_KEY} "
                           f"({type(e).__name__}: {e})") from None
