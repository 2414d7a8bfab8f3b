"""Tracking: MLflow (default, SQLite store, no server) or none. The console progress line is
rlrun/tracking/progress.py; what a run records about itself (params, git SHA, versions) is rlrun/core/provenance.py.

The MLflow tracker does all its work in a child process (``rlrun/tracking/writer.py``): importing
mlflow (~1 s), creating the SQLite schema (~1.5 s on first use) and every ``log_batch`` run on the
other core, in parallel with training. Calls from the training loop only send small messages. An MLflow error is raised
in the training loop at the next call, so a broken store stops the run early.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rlrun.config.schemas import TrackingConfig
from rlrun.tracking import writer_messages as msg
from rlrun.tracking.writer_messages import MetricRow


def default_tracking_uri(launch_dir: str | Path) -> str:
    """``sqlite:///<absolute launch dir>/mlflow.db``: absolute, so Ray workers and later shells agree."""
    return f"sqlite:///{Path(launch_dir).resolve() / 'mlflow.db'}"


def store_locations(tracking_uri: str | None, artifact_location: str | None,
                    launch_dir: str | Path) -> tuple[str, str | None]:
    """The tracking URI (default: the launch dir's SQLite file) and where a new experiment keeps its
    artifacts (default for SQLite: ``mlartifacts`` beside the database)."""
    uri = tracking_uri or default_tracking_uri(launch_dir)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.is_absolute():
            raise TrackingError(f"tracking.tracking_uri: a SQLite path must be absolute, got {uri}")
        artifact_location = artifact_location or (db.parent / "mlartifacts").as_uri()
    return uri, artifact_location


class Tracker:
    """No-op tracker (``tracking=none``); also the interface."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.uri: str | None = None
        self.experiment_name: str | None = None
        self.experiment_id: str | None = None

    def start(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None: ...

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None: ...

    def log_artifact(self, local_file: str | Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def wait_started(self, timeout: float = 120.0) -> str | None:
        """Block until the tracking run exists; its id (None without tracking)."""
        return None

    def log_learning_curve(self, points: list[tuple[float, float]], title: str,
                           eval_points: list[tuple[float, float]] | None = None, window: int = 100) -> None:
        """A PNG of training return (and greedy evaluation points) vs env steps: ``learning_curve.png``."""

    def log_model(self, checkpoint_dir: str | Path, launch_dir: str | Path,
                  actors_dir: str | Path | None = None) -> None:
        """Log the checkpoint's greedy policy as the run's MLflow model ``model`` (see rlrun/training/export.py);
        ``actors_dir``: the policies' actors as the trainer traced them (``save_actors``)."""

    def is_uploaded(self, local_dir: str | Path) -> bool:
        """Whether ``log_artifacts(local_dir)`` has finished, so the local copy may be deleted."""
        return True

    def wait_uploaded(self, local_dir: str | Path, timeout: float = 600.0) -> bool:
        """Block until ``log_artifacts(local_dir)`` has finished (False: not within ``timeout``)."""
        return True

    def check(self) -> None: ...

    def end(self, status: str = "FINISHED") -> None: ...

    def end_in_background(self, status: str, pending_file: Path) -> int | None:
        """End the run, leaving what is left to write to the writer process; its pid (None: done)."""
        self.end(status)
        return None


class TrackingError(RuntimeError):
    pass


def clean_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The finite numbers of a result dict, as floats (what MLflow stores)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


FLUSH_EVERY_S = 1.0  # metrics of the iterations within this window go out in one log_batch


class MlflowTracker(Tracker):
    """One MLflow run, written by a child process (reused by the next run in this process).

    The child (a fresh ``python``, so it never re-imports the user's main module) imports mlflow,
    creates the SQLite schema and does every ``log_batch`` on the machine's other core, so none of
    it holds the trainer's GIL. Jobs go over a private socket pair, in order. Each iteration's
    metrics keep their own step and timestamp; iterations within ``FLUSH_EVERY_S`` travel in one
    batch. If the trainer process dies without ending the run, the child marks it KILLED.
    """

    def __init__(self, init: msg.Init, journal: bool = True) -> None:
        self.uri, self.artifact_location = init.uri, init.artifact_location
        self.resume_run_id = init.resume_run_id
        self._skip_through_step = -1  # on resume: steps already in MLflow are not logged again
        self.experiment_name = init.experiment_name
        self.run_id: str | None = None
        self.experiment_id: str | None = None  # both set when the writer says the run exists
        self._init = init
        # every message after Init: what rlrun-wait replays if the writer dies after the run has ended in the
        # background (``end_in_background``); a run that waits for its writer keeps none (hours of metrics)
        self._journal: list[Any] | None = [] if journal else None
        self._pending: list[MetricRow] = []
        self._error: TrackingError | None = None  # the writer's first error: every later call reports it
        self._uploaded: set[str] = set()
        self._last_flush = 0.0
        self._ended = False
        self._writer = _take_writer()
        self._conn = self._writer.conn
        self._send(init)

    def _send(self, message: Any) -> None:
        if self._journal is not None and not isinstance(message, msg.Init | msg.End):
            self._journal.append(message)
        try:
            self._conn.send(message)
        except OSError as e:
            self._poll()  # the writer's own error, if it sent one before it went, is the real cause
            raise TrackingError(f"MLflow tracking process is gone ({self._writer.exit_status()}, {self.uri}): "
                                f"{e}") from None

    def start(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        self._send(msg.Start(dict(params), dict(tags), int(time.time() * 1000)))

    def send_recorded(self, message: Any) -> None:
        """Send a message as a pending-run record holds it (``rlrun-wait`` replaying a run)."""
        self._flush()
        self._send(message)

    def wait_started(self, timeout: float = 120.0) -> str | None:
        """Block until the MLflow run exists; returns its id."""
        deadline = time.monotonic() + timeout
        while self.run_id is None and time.monotonic() < deadline:
            self._poll(block_s=0.1)
        if self.run_id is None:
            raise TrackingError(f"MLflow run was not created within {timeout:.0f} s ({self.uri})")
        return self.run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        if step <= self._skip_through_step:
            return  # a redone iteration after a crash: MLflow already has this step
        self._pending.append((clean_metrics(metrics), step, timestamp_ms or int(time.time() * 1000)))
        if time.monotonic() - self._last_flush >= FLUSH_EVERY_S:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._send(msg.Metrics(self._pending))
            self._pending = []
        self._last_flush = time.monotonic()

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self._flush()
        self._send(msg.Artifacts(str(local_dir), artifact_path))

    def log_artifact(self, local_file: str | Path, artifact_path: str | None = None) -> None:
        self._flush()
        self._send(msg.Artifact(str(local_file), artifact_path))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._send(msg.Tags(dict(tags)))

    def _poll(self, block_s: float = 0.0) -> list[type]:
        """Handle the writer's replies that have arrived (waiting up to ``block_s`` for the first)."""
        kinds: list[type] = []
        try:
            while self._conn.poll(block_s):
                block_s = 0.0
                reply = self._conn.recv()
                kinds.append(type(reply))
                if isinstance(reply, msg.RunStarted):
                    self.run_id, self._skip_through_step = reply.run_id, reply.last_step
                    self.experiment_id = reply.experiment_id
                elif isinstance(reply, msg.Uploaded):
                    self._uploaded.add(reply.local_dir)
                elif isinstance(reply, msg.Error):
                    self._error = self._error or TrackingError(f"MLflow tracking failed ({self.uri}): {reply.message}")
                    raise self._error
        except (EOFError, OSError):
            if self._error is not None:  # the writer said why before it went: that is the real cause
                raise self._error from None
            if not self._ended:
                raise TrackingError(
                    f"MLflow tracking process exited unexpectedly ({self._writer.exit_status()}, {self.uri})"
                ) from None
        return kinds

    def log_learning_curve(self, points: list[tuple[float, float]], title: str,
                           eval_points: list[tuple[float, float]] | None = None, window: int = 100) -> None:
        def clean(ps: list[tuple[float, float]]) -> list[tuple[float, float]]:
            return [(float(x), float(y)) for x, y in ps if math.isfinite(y)]
        self._send(msg.Curve(clean(points), title, clean(eval_points or []), window))

    def log_model(self, checkpoint_dir: str | Path, launch_dir: str | Path,
                  actors_dir: str | Path | None = None) -> None:
        self._send(msg.Model(str(checkpoint_dir), str(launch_dir), None if actors_dir is None else str(actors_dir)))

    def is_uploaded(self, local_dir: str | Path) -> bool:
        self._poll()
        return str(local_dir) in self._uploaded

    def wait_uploaded(self, local_dir: str | Path, timeout: float = 600.0) -> bool:
        deadline = time.monotonic() + timeout
        while str(local_dir) not in self._uploaded and time.monotonic() < deadline:
            self._poll(block_s=0.2)
        return str(local_dir) in self._uploaded

    def check(self) -> None:
        self._poll()

    def end(self, status: str = "FINISHED", timeout: float = 300.0) -> None:
        """Send the rest, mark the run ``status`` ('': leave it as it is) and wait until the child wrote it all."""
        if self._ended:
            return
        error: TrackingError | None = None
        try:
            self._flush()
            self._send(msg.End(status))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    if msg.Ended in self._poll(block_s=0.2):
                        break
                except TrackingError as e:
                    error = error or e
                    if not self._writer.alive():
                        break
        except TrackingError as e:
            error = e
        finally:
            self._ended = True
            if error is None and self._writer.alive():
                _IDLE_WRITERS.append(self._writer)  # the next run in this process reuses it
            else:
                self._writer.close()
        if error is not None:
            raise error

    def end_in_background(self, status: str, pending_file: Path) -> int | None:
        """End the run without waiting for the writer: it finishes the MLflow record (model, curve,
        status) on its own while this process exits. First ``pending_file`` gets what the run sent
        (``rlrun-wait`` replays it if the writer dies before it is done; the writer deletes it once
        the run is complete). Returns the writer's pid; None when that cannot be done (a sweep's
        shared writer, an error already reported), and then the run has been ended as ``end`` does."""
        if self._ended:
            return None
        self._poll()  # an error the writer already reported is raised here, as end() would
        proc = self._writer.proc
        if proc is None or not self._writer.alive() or self._journal is None:
            self.end(status)
            return None
        self._flush()
        from rlrun.core.liveness import process_start

        msg.write_record(pending_file, self._init, self._journal, status, self.run_id, proc.pid,
                         process_start(proc.pid))
        self._send(msg.End(status, str(pending_file)))
        self._ended = True
        self._conn.close()  # the writer reads to the end, then sees EOF after End: nothing is lost
        return proc.pid


class Writer:
    """This process's line to an MLflow writer: its own child process (``proc``), or a connection to
    the sweep's shared writer process (``proc`` None; see ``use_shared_writer``)."""

    def __init__(self, conn: Connection, proc: subprocess.Popen[bytes] | None = None, address: str = "",
                 cwd: str | None = None) -> None:
        self.conn, self.proc, self.address = conn, proc, address
        self.cwd = cwd  # a child's working directory, where MLflow resolves a relative store or artifact path

    def alive(self) -> bool:
        if self.conn.closed:
            return False
        if self.proc is not None:
            return self.proc.poll() is None
        try:  # between runs the shared writer sends nothing: readable means it has gone
            return not self.conn.poll(0)
        except OSError:
            return False

    def exit_status(self) -> str:
        return "shared writer" if self.proc is None else f"code {self.proc.poll()}"

    def close(self) -> None:
        self.conn.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# Writers whose run has ended, waiting for this process's next run (a sweep's next job). When this
# process exits, their sockets close: a child writer exits, the shared writer drops the connection.
_IDLE_WRITERS: list[Writer] = []
_SHARED_WRITER: list[str] = []  # the Unix socket of this sweep's shared writer, if any


def use_shared_writer(address: str | None) -> None:
    """Runs in this process write through the writer process listening at ``address`` (a sweep's,
    started by its driver: one mlflow import and warm-up for all jobs on this machine) when it can be
    reached; otherwise, or with None, through a child process of their own."""
    _SHARED_WRITER[:] = [address] if address else []


def start_writer_early() -> None:
    """Start this process's MLflow writer now, before the config is composed and torch imported, so
    that its imports (mlflow, ~1.5 s) run on the other core while the run starts and trains; the
    run's tracker takes it. A run that turns out not to track leaves it idle: it exits with this process."""
    if not _IDLE_WRITERS and not _SHARED_WRITER:
        _IDLE_WRITERS.append(_new_writer())


def _take_writer() -> Writer:
    """An idle writer (mlflow already imported), else the sweep's shared writer, else a new child."""
    shared = _SHARED_WRITER[0] if _SHARED_WRITER else ""
    while _IDLE_WRITERS:  # a child started in another working directory (maybe removed since) is not reused
        w = _IDLE_WRITERS.pop()
        if w.alive() and w.address == shared and (w.proc is None or w.cwd == _cwd()):
            return w
        w.close()
    if shared and os.path.exists(shared):
        from multiprocessing import AuthenticationError
        from multiprocessing.connection import Client

        try:
            return Writer(Client(shared, family="AF_UNIX", authkey=msg.read_authkey(shared)), address=shared)
        except (OSError, AuthenticationError):
            pass  # gone (sweep over) or not ours to reach: a child of our own
    return _new_writer()


def _new_writer() -> Writer:
    ours, theirs = socket.socketpair()
    # its own session: a scheduler or the OOM killer that kills the trainer's process group leaves
    # the writer alive to finish what it was sent and mark the run KILLED when the socket closes
    proc: subprocess.Popen[bytes] = spawn_writer("run", str(theirs.fileno()), pass_fds=[theirs.fileno()],
                                                 stdin=subprocess.DEVNULL, start_new_session=True)
    theirs.close()
    return Writer(Connection(ours.detach()), proc, cwd=_cwd())


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except FileNotFoundError:  # this process's own working directory was removed
        return None


def spawn_writer(entry: str, arg: str, **popen_kwargs: Any) -> Any:
    """Start an MLflow writer process: a fresh ``python`` (it never re-imports the user's main module)
    running ``rlrun.tracking.writer.<entry>(arg)`` (``run``: a trainer's own child on a socket pair fd;
    ``serve``: a sweep's shared writer on a Unix socket path), with this process's ``sys.path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # a tracking server that goes away fails the run in ~15 s, not after MLflow's ~4 min of retries
    env.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    env.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    cast = "int(sys.argv[1])" if entry == "run" else "sys.argv[1]"
    code = f"import sys; from rlrun.tracking.writer import {entry}; {entry}({cast})"
    return subprocess.Popen([sys.executable, "-c", code, arg], env=env, **popen_kwargs)


def make_tracker(cfg: TrackingConfig, launch_dir: str | Path, experiment_name: str,
                 resume_run_id: str | None = None, resume_run_key: str | None = None) -> Tracker:
    """The run's tracker; a resumed run continues MLflow run ``resume_run_id``, or the run tagged
    ``rlrun.run_key = resume_run_key`` when its checkpoint was written before MLflow had an id."""
    if cfg.backend == "none":
        return Tracker()
    uri, artifact_location = store_locations(cfg.tracking_uri, cfg.artifact_location, launch_dir)
    return MlflowTracker(msg.Init(uri, artifact_location, cfg.experiment_name or experiment_name, cfg.run_name,
                                  resume_run_id, cfg.log_model, None if resume_run_id else resume_run_key),
                         journal=not cfg.wait)
