"""The MLflow writer: a child process that writes a trainer's MLflow runs (see tracking.py).

For each run it does the trainer's jobs in order (start or resume the run, log metrics, artifacts,
tags, the learning curve, the final policy as an MLflow model, end); then it waits for the next
run from the same trainer process (the jobs of a sweep), so mlflow is imported once per process,
not once per run. Slow imports needed at the end of a run (matplotlib, mlflow.pytorch) happen right
after the first start, while the trainer trains. A reader thread keeps the socket drained while a
job (the first-time SQLite schema creation, say) takes a while. If the trainer dies, the socket
closes and the open run is marked KILLED. It ignores Ctrl-C: the trainer decides how a run ends.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from rlrun.core.errors import one_line
from rlrun.core.fast_exit import exit_now
from rlrun.tracking import writer_messages as msg
from rlrun.tracking.mlflow_runs import WRITER_CALLS, open_store
from rlrun.tracking.writer_jobs import Reply, RunJobs, one_run


def run(fd: int) -> None:
    """Entry point: ``main``, then exit at once (every write is committed by then; skipping the
    interpreter's teardown saves a second or more with torch and mlflow loaded)."""
    try:
        main(fd)
    finally:
        exit_now(0, run_exit_handlers=False)


def main(fd: int) -> None:
    """The tracking child of one trainer process: its MLflow runs one after another (a sweep's jobs
    in one process reuse it)."""
    _quiet()
    shared = _Shared()
    # imports start now, not when the first run's Init arrives: a writer started early (``rlrun``
    # starts it before composing the config) is ready by the time a short run has trained
    threading.Thread(target=_warm_up_early, args=(shared,), daemon=True).start()
    _serve(Connection(fd), shared)


def _warm_up_early(shared: _Shared) -> None:
    """What the first run's Init and Start need first (mlflow, ~1.5 s; its SQL store, ~0.8 s, which
    otherwise the first ``open_store`` pays), then what its end needs; each step holds the lock, so a
    job that arrives meanwhile waits for one step at most."""
    with shared.lock:
        import mlflow.tracking
    with shared.lock, contextlib.suppress(ImportError):  # a later MLflow that moved it only loses the head start
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    _warm_up(shared, model=True)


def serve(address: str) -> None:
    """Entry point of a sweep's shared writer: one thread per trainer that connects to the Unix
    socket ``address`` (a job in the driver or in a Ray worker on this machine), each serving that
    trainer's runs as ``main`` does. Stdin is the sweep driver's lifeline: once it closes (sweep over,
    or driver gone), no new trainers are taken, and the process exits when no run is open."""
    import os
    import time
    from multiprocessing.connection import Listener

    try:
        _quiet()
        shared = _Shared()
        key = msg.read_authkey(address)
        listener = Listener(address, family="AF_UNIX")  # the key is checked per connection, in its thread
        print(address, flush=True)  # ready: the driver waits for this line
        os.dup2(2, 1)  # anything printed later goes where the driver's errors go, not into a pipe no one reads

        def accept() -> None:
            while True:
                try:
                    conn = listener.accept()
                except OSError:
                    return
                threading.Thread(target=_serve_authenticated, args=(conn, key, shared), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        threading.Thread(target=_warm_up_all, args=(shared,), daemon=True).start()

        sys.stdin.read()  # until the driver closes it
        deadline = time.monotonic() + 600
        while shared.open_runs and time.monotonic() < deadline:
            time.sleep(0.1)
        listener.close()
    finally:
        # each step on its own: Listener.close() has usually unlinked the socket already
        folder = os.path.dirname(address)
        for remove, path in ((os.unlink, address), (os.unlink, os.path.join(folder, msg.AUTHKEY_FILE)),
                             (os.rmdir, folder)):
            with contextlib.suppress(OSError):
                remove(path)
        exit_now(0, run_exit_handlers=False)


class _Shared:
    """What the trainers served by one writer process share."""

    def __init__(self) -> None:
        self.clients: dict[str, Any] = {}  # one MlflowClient per tracking URI
        self.warmed: set[str] = set()
        # One job at a time does MLflow work (or imports) in this process: two threads importing
        # mlflow's circular modules at once can see a half-initialised module; matplotlib and mlflow's
        # fluent model API are not thread-safe either. SQLite serialises the writes anyway.
        self.lock = threading.RLock()
        self.books = threading.Lock()  # for open_runs
        self.open_runs = 0
        self.parent_done = threading.Event()  # the sweep driver's first call (its parent run) is done

    def client(self, uri: str) -> Any:
        with self.lock:
            if uri not in self.clients:
                self.clients[uri] = open_store(uri)
            return self.clients[uri]

    def count_run(self, delta: int) -> None:
        with self.books:
            self.open_runs += delta

    def warm_up(self, model: bool) -> None:
        _warm_up(self, model)


def _warm_up_all(shared: _Shared) -> None:
    """A sweep's writer: import and warm up now, while the sweep sets up, not in its first jobs (mlflow
    first: the driver's parent run waits for it)."""
    with shared.lock:
        import mlflow.tracking  # noqa: F401
    shared.parent_done.wait(timeout=60)  # the lock is not fair: let the parent run (jobs wait for it) go first
    _warm_up(shared, model=True)


def _warm_up(shared: _Shared, model: bool) -> None:
    """Import what the end of a run needs (matplotlib; mlflow.pytorch when the model is logged),
    once per process, each step holding the lock (other jobs may go in between)."""
    with shared.lock:
        if "plot" not in shared.warmed:
            _warm_up_plotting()
            shared.warmed.add("plot")
    if not model:
        return
    with shared.lock:
        if "model" not in shared.warmed:
            from rlrun.tracking.model_files import warm_up as warm_up_model

            warm_up_model()
            shared.warmed.add("model")


def _call(call: msg.Call, shared: _Shared) -> msg.Result | msg.Error:
    try:
        with shared.lock:
            return msg.Result(WRITER_CALLS[call.name](**call.kwargs))
    except Exception as e:
        return msg.Error(f"{call.name}: {one_line(e)}")
    finally:
        shared.parent_done.set()


def _quiet() -> None:
    import logging
    import signal

    # No notebook ever runs in this process: MLflow's run-context check imports IPython when it is
    # installed (0.22 s of CPU per writer here, 2026-11-26) only to learn that; None makes the import
    # fail at once, which MLflow takes for "not in a notebook".
    sys.modules.setdefault("IPython", None)  # type: ignore[arg-type]

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; we finish writing
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


HANDSHAKE_TIMEOUT_S = 10.0


def _serve_authenticated(conn: Connection, key: bytes, shared: _Shared) -> None:
    """A sweep writer's connection: the client must prove it has the key (multiprocessing's HMAC
    challenge, both ways, as ``Listener(authkey=...)`` does) within ``HANDSHAKE_TIMEOUT_S`` before a
    single message is read; otherwise the connection is closed and nothing else is disturbed."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import answer_challenge, deliver_challenge

    timer = threading.Timer(HANDSHAKE_TIMEOUT_S, conn.close)
    timer.start()
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
    except (AuthenticationError, EOFError, OSError):
        conn.close()
        return
    finally:
        timer.cancel()
    _serve(conn, shared)


def _serve(conn: Connection, shared: _Shared) -> None:
    """One trainer's runs, each run's jobs in order; a reader thread keeps the socket drained meanwhile."""

    jobs: queue.Queue[Any] = queue.Queue()
    detached = threading.Event()  # the trainer has returned without waiting (End with a pending file)

    def reader() -> None:
        try:
            while True:
                job = conn.recv()
                if isinstance(job, msg.End) and job.pending_file:
                    detached.set()
                jobs.put(job)
        except (EOFError, OSError):
            jobs.put(msg.Eof())

    threading.Thread(target=reader, daemon=True).start()

    def reply(message: Any) -> None:  # best effort: a dead trainer must not stop the bookkeeping
        with contextlib.suppress(OSError):
            conn.send(message)

    try:
        _serve_jobs(jobs, reply, shared, detached)
    except Exception as e:  # a bug here must not leave the trainer waiting for replies that never come
        reply(msg.Error(f"MLflow writer: {type(e).__name__}: {e}"))
        conn.close()
        raise


def _serve_jobs(jobs: queue.Queue[Any], reply: Reply, shared: _Shared, detached: threading.Event) -> None:
    while True:
        job = jobs.get()
        if isinstance(job, msg.Eof):
            return
        if isinstance(job, msg.Call):  # the sweep driver's MLflow work (rlrun.tracking.mlflow_runs.WRITER_CALLS)
            reply(_call(job, shared))
            continue
        if not isinstance(job, msg.Init):
            reply(msg.Error(f"expected Init, got {type(job).__name__}"))
            continue
        shared.count_run(+1)
        try:
            if not one_run(RunJobs(job, shared.client(job.uri), reply, shared, detached), jobs):
                return
        finally:
            shared.count_run(-1)


def _warm_up_plotting() -> None:
    """Import matplotlib while the trainer trains, so the end-of-run learning curve costs no wait."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


