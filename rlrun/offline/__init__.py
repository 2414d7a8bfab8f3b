"""Offline data: experience written to and read from files (README "Offline data").

- ``config``: the ``input`` / ``output`` / ``offline`` settings and their checks (no torch, no pyarrow).
- ``spaces``: gymnasium spaces <-> JSON (a dataset's metadata).
- ``parquet``: rlrun's Parquet format and the writer; ``reader``: the streamed, shuffled readers;
  ``minari_io``: Minari datasets in and out.
- ``input``: where a training batch comes from (rollout workers, files, or a weighted mix).
- ``record``: a checkpoint's episodes as a dataset (``rlrun-eval ... output=``).
- ``estimators``, ``ope``: off-policy evaluation.
- ``episodes``: ``EpisodeWriter``, for saving episodes that rlrun did not sample.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # lazy: `rlrun.offline.config` must not import pyarrow
    if name == "EpisodeWriter":
        from rlrun.offline.episodes import EpisodeWriter

        return EpisodeWriter
    raise AttributeError(name)


__all__ = ["EpisodeWriter"]
