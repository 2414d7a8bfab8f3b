"""Runs whose MLflow record is still being written after ``rlrun`` returned, and ``rlrun-wait``.

With ``tracking.wait: false`` (the default) a finished run does not wait for the end-of-run MLflow
work (the model export, the learning curve, the final status: seconds that would otherwise be most
of a short run's wall time). Its writer process finishes them on its own. Before the trainer leaves,
it writes ``<output dir>/mlflow-pending.json``: the writer's pid and every message the run sent it.
The writer deletes it once MLflow holds the whole run. The writer keeps rlrun's stdout and stderr: a
terminal gets its prompt back when ``rlrun`` exits, while a caller that reads rlrun's output to its
end (a pipe, ``subprocess.run(capture_output=True)``) sees that end when the writer is done too.

``rlrun-wait [DIR ...]`` waits for the writers of the pending runs under each DIR (default: the
current directory). If a writer is gone and its record is still there (killed, out of memory, an
MLflow error), it replays the record into the same MLflow run (or a new one if the writer never got
to create it): steps MLflow already holds are skipped, so nothing is lost and nothing is doubled.
It imports neither torch nor mlflow unless it has to replay.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rlrun.core.liveness import still_running
from rlrun.tracking import writer_messages as msg

PENDING_FILE = "mlflow-pending.json"
FORMAT = msg.PENDING_FORMAT
_KINDS = {t.__name__: t for t in (msg.Start, msg.Metrics, msg.Artifacts, msg.Artifact, msg.Tags, msg.Curve,
                                  msg.Model)}


class RecordError(ValueError):
    """A pending record that cannot be read."""


def read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RecordError(f"{path}: not a pending-run record rlrun wrote ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise RecordError(f"{path}: not a pending-run record rlrun wrote (format {FORMAT} expected)")
    return record


def messages_of(record: dict[str, Any]) -> list[Any]:
    """The record's messages as the writer's message types (JSON made tuples lists)."""
    out = []
    for m in record["messages"]:
        fields = {k: v for k, v in m.items() if k != "kind"}
        if m["kind"] == "Metrics":
            fields["rows"] = [tuple(r) for r in fields["rows"]]
        elif m["kind"] == "Curve":
            fields = {**fields, "points": [tuple(p) for p in fields["points"]],
                      "eval_points": [tuple(p) for p in fields["eval_points"]]}
        out.append(_KINDS[m["kind"]](**fields))
    return out


def replay(record: dict[str, Any]) -> str:
    """Write a pending run whose writer is gone into MLflow from its record; the run's id."""
    from rlrun.tracking.mlflow_runs import RUN_KEY_TAG
    from rlrun.tracking.tracker import MlflowTracker

    init = msg.Init(**record["init"])
    messages = messages_of(record)
    run_id = record["run_id"] or init.resume_run_id
    # else the run the dead writer created, if it got that far: the new writer finds it by run key
    key = next((m.tags.get(RUN_KEY_TAG) for m in messages if isinstance(m, msg.Start)), None)
    tracker = MlflowTracker(dataclasses.replace(init, resume_run_id=run_id, resume_run_key=None if run_id else key))
    for m in messages:
        if isinstance(m, msg.Start):
            tracker.start(m.params, m.tags)
            tracker.wait_started()
        elif isinstance(m, msg.Metrics):
            for row in m.rows:
                tracker.log_metrics(*row)  # steps MLflow holds are skipped
        elif isinstance(m, msg.Artifacts | msg.Artifact):
            local = m.local_dir if isinstance(m, msg.Artifacts) else m.local_file
            if os.path.exists(local):  # an old checkpoint the run deleted once it was uploaded
                tracker.send_recorded(m)
        else:
            tracker.send_recorded(m)
    tracker.end(record["status"])
    assert tracker.run_id is not None
    return tracker.run_id


def pending_records(paths: list[str]) -> list[Path]:
    """The pending records under each path (a run's output dir, or any directory above it)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise RecordError(f"{p}: no such file or directory")
        found += [p] if p.is_file() else sorted(p.rglob(PENDING_FILE))
    return found


def wait_for(path: Path, timeout_s: float) -> str:
    """Wait for one pending run; what became of it (one line)."""
    record = read_record(path)
    pid, out_dir = int(record["writer_pid"]), path.parent

    def writer_alive() -> bool:  # the same process: a recycled pid is not the writer
        return still_running(pid, record.get("writer_pid_start"))

    deadline = time.monotonic() + timeout_s
    while path.exists() and writer_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not path.exists():
        return f"{out_dir}: MLflow run complete: {where(record)}"
    if writer_alive():
        raise TimeoutError(f"{out_dir}: still being written by the MLflow writer (pid {pid}) after {timeout_s:g} s")
    run_id = replay(record)
    path.unlink()
    return f"{out_dir}: the MLflow writer (pid {pid}) stopped before it finished; written from the record: " \
           f"run {run_id} complete"


def where(record: dict[str, Any]) -> str:
    """The run (its id if the record has it, else its name), its experiment and how to browse it."""
    init = record["init"]
    run = f"run {record['run_id']}" if record.get("run_id") else f"run '{init.get('run_name')}'"
    return f"{run} in experiment '{init['experiment_name']}' (mlflow ui --backend-store-uri {init['uri']})"


def finish_pending(checkpoint: Path, timeout_s: float = 600.0) -> str | None:
    """Wait for (or replay) the MLflow record of the run that wrote ``checkpoint`` if it is still
    pending: a resume must not get the old writer's last status, and ``rlrun-eval`` logs into the
    run, so it must exist. What became of it (None: nothing was pending)."""
    record = Path(checkpoint).parent.parent / PENDING_FILE  # <output dir>/checkpoints/iter_N
    return wait_for(record, timeout_s) if record.exists() else None


def main(argv: list[str] | None = None) -> int:
    """``rlrun-wait``: wait until MLflow holds every pending run under the given directories."""
    parser = argparse.ArgumentParser(prog="rlrun-wait", description=main.__doc__)
    parser.add_argument("paths", nargs="*", default=["."], help="run output dirs or directories above them")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each writer")
    args = parser.parse_args(argv)
    try:
        records = pending_records(args.paths)
        for path in records:
            print(f"rlrun-wait: {wait_for(path, args.timeout)}", flush=True)
    except (RecordError, TimeoutError) as e:
        print(f"rlrun-wait: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, RecordError) else 1
    except Exception as e:  # a replay that MLflow refused: the record stays for the next try
        from rlrun.tracking.tracker import TrackingError

        if not isinstance(e, TrackingError):
            raise
        print(f"rlrun-wait: error: {e}", file=sys.stderr)
        return 1
    if not records:
        print("rlrun-wait: nothing pending", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
