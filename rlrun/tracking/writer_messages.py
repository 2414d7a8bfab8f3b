"""The MLflow writer's protocol: small frozen dataclasses, one per message kind (a leaf module).

Trainer -> writer: ``Init`` opens a run's conversation, then ``Start`` (create or resume the
MLflow run), any number of ``Metrics`` / ``Artifact`` / ``Artifacts`` / ``Tags`` / ``Curve`` /
``Model``, and ``End``. A sweep driver sends ``Call`` (one of the writer's named MLflow jobs).
Writer -> trainer: ``RunStarted``, ``Uploaded``, ``Ended``, ``Result`` and ``Error``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlrun.core.history import MetricRow

AUTHKEY_FILE = "authkey"  # beside a shared writer's socket, in its 0700 directory, mode 0600


def new_authkey(socket_path: str) -> bytes:
    """A random key for the shared writer listening at ``socket_path``, written 0600 beside it: every
    connection must prove it knows the key (multiprocessing's HMAC challenge) before anything is read."""
    import secrets

    key = secrets.token_bytes(32)
    path = Path(socket_path).with_name(AUTHKEY_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def read_authkey(socket_path: str) -> bytes:
    """The key of the shared writer at ``socket_path`` (only its user can read it)."""
    return Path(socket_path).with_name(AUTHKEY_FILE).read_bytes()


@dataclass(frozen=True)
class Init:
    uri: str
    artifact_location: str | None
    experiment_name: str
    run_name: str | None
    resume_run_id: str | None
    log_model: bool
    # resume the run tagged with this rlrun.run_key when the checkpoint predates the MLflow run id
    resume_run_key: str | None = None


@dataclass(frozen=True)
class Start:
    params: dict[str, str]
    tags: dict[str, str]
    start_time_ms: int | None = None  # when the trainer started (the writer creates the run later)


@dataclass(frozen=True)
class Metrics:
    rows: list[MetricRow]


@dataclass(frozen=True)
class Artifacts:
    local_dir: str
    artifact_path: str | None = None


@dataclass(frozen=True)
class Artifact:
    local_file: str
    artifact_path: str | None = None


@dataclass(frozen=True)
class Tags:
    tags: dict[str, str]


@dataclass(frozen=True)
class Curve:
    points: list[tuple[float, float]]
    title: str
    eval_points: list[tuple[float, float]] = field(default_factory=list)
    window: int = 100  # the episodes each training point averages


@dataclass(frozen=True)
class Model:
    checkpoint_dir: str
    launch_dir: str
    actors_dir: str | None = None  # the trainer's traced actors (export.save_actors); None: trace them here


@dataclass(frozen=True)
class End:
    status: str  # the run's end state; '' leaves it as it is (Tracker.end(''))
    # set when the trainer does not wait (``tracking.wait: false``): the record of the run it left
    # (rlrun/tracking/pending.py); the writer deletes it once the run is complete and leaves it for
    # ``rlrun-wait`` to replay if a job fails (it prints why to stderr: nobody else would hear it)
    pending_file: str | None = None


@dataclass(frozen=True)
class Call:
    name: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Eof:
    """Not sent: what the writer's reader thread queues when the trainer's socket closes."""


# ---------------------------------------------------------------- replies
@dataclass(frozen=True)
class RunStarted:
    run_id: str
    last_step: int  # on resume: the newest env step MLflow already holds (-1 for a new run)
    experiment_id: str = ""


@dataclass(frozen=True)
class Uploaded:
    local_dir: str


@dataclass(frozen=True)
class Ended:
    pass


@dataclass(frozen=True)
class Result:
    value: Any


@dataclass(frozen=True)
class Error:
    message: str


RunMessage = Start | Metrics | Artifacts | Artifact | Tags | Curve | Model | End | Eof


# ---------------------------------------------------------------- the record a run ending in the background leaves
PENDING_FORMAT = "rlrun.mlflow-pending/1"


def write_record(path: Path, init: Init, messages: list[Any], status: str, run_id: str | None,
                 writer_pid: int, writer_pid_start: str | None) -> None:
    """The pending record of a run that ends in the background (read by rlrun/tracking/pending.py), whole or
    not at all (written under another name, then renamed)."""
    record = {"format": PENDING_FORMAT, "writer_pid": writer_pid, "writer_pid_start": writer_pid_start,
              "status": status, "run_id": run_id,
              "output_dir": str(path.parent), "init": dataclasses.asdict(init),
              "messages": [{"kind": type(m).__name__, **dataclasses.asdict(m)} for m in messages]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
