"""Offline data: experience written to and read from files.

- ``config``: the ``input`` / ``output`` / ``offline`` settings and their checks (no torch, no pyarrow).
- ``spaces``: gymnasium spaces <-> JSON (a dataset's metadata).
- ``parquet``: rlrun's Parquet format, the episode-buffered writer and the streamed reader.
- ``input``: where a training batch comes from (rollout workers, files, or a weighted mix).
"""
