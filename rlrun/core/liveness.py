"""Whether a process is still the one we started: pid plus its start time (a recycled pid is not).
Runs, checkpoints, Ray instances and pending MLflow records name their process this way."""

from __future__ import annotations

from pathlib import Path


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/<pid>/stat), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name; starttime is the 22nd


def still_running(pid: int | str, start: str | None) -> bool:
    """Whether process ``pid`` of this host still runs and is the same process (its start time is
    ``start``, when known): a recycled pid is not."""
    now = process_start(int(pid)) if str(pid).isdigit() else None
    return now is not None and now == (start or now)

