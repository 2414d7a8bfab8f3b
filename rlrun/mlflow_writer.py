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
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rlrun import writer_messages as msg
from rlrun.fast_exit import exit_now
from rlrun.mlflow_runs import WRITER_CALLS, create_run, log_curve, log_params, open_store, reap_dead_runs, run_with_key


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
    _serve(Connection(fd), _Shared())


def serve(address: str) -> None:
    """Entry point of a sweep's shared writer: one thread per trainer that connects to the Unix
    socket ``address`` (a job in the driver or in a Ray worker on this machine), each serving that
    trainer's runs as ``main`` does. Stdin is the sweep driver's lifeline: once it closes (sweep over,
    or driver gone), no new trainers are taken, and the process exits when no run is open."""
    import os
    import threading
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
        import threading

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
            from rlrun.export import warm_up as warm_up_model

            warm_up_model()
            shared.warmed.add("model")


def _call(call: msg.Call, shared: _Shared) -> msg.Result | msg.Error:
    try:
        with shared.lock:
            return msg.Result(WRITER_CALLS[call.name](**call.kwargs))
    except Exception as e:
        return msg.Error(f"{call.name}: {_one_line(e)}")
    finally:
        shared.parent_done.set()


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _quiet() -> None:
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; we finish writing
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


Reply = Callable[[Any], None]
HANDSHAKE_TIMEOUT_S = 10.0


def _serve_authenticated(conn: Connection, key: bytes, shared: _Shared) -> None:
    """A sweep writer's connection: the client must prove it has the key (multiprocessing's HMAC
    challenge, both ways, as ``Listener(authkey=...)`` does) within ``HANDSHAKE_TIMEOUT_S`` before a
    single message is read; otherwise the connection is closed and nothing else is disturbed."""
    import threading
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
    import threading

    jobs: queue.Queue[Any] = queue.Queue()

    def reader() -> None:
        try:
            while True:
                job = conn.recv()
                if isinstance(job, msg.End) and job.pending_file:  # the trainer returns without waiting
                    _DETACHED.append(job.pending_file)
                jobs.put(job)
        except (EOFError, OSError):
            jobs.put(msg.Eof())

    threading.Thread(target=reader, daemon=True).start()

    def reply(message: Any) -> None:  # best effort: a dead trainer must not stop the bookkeeping
        with contextlib.suppress(OSError):
            conn.send(message)

    try:
        _serve_jobs(jobs, reply, shared)
    except Exception as e:  # a bug here must not leave the trainer waiting for replies that never come
        reply(msg.Error(f"MLflow writer: {type(e).__name__}: {e}"))
        conn.close()
        raise


_DETACHED: list[str] = []  # the pending file, once the trainer has left without waiting


def _serve_jobs(jobs: queue.Queue[Any], reply: Reply, shared: _Shared) -> None:
    while True:
        job = jobs.get()
        if isinstance(job, msg.Eof):
            return
        if isinstance(job, msg.Call):  # the sweep driver's MLflow work (rlrun.mlflow_runs.WRITER_CALLS)
            reply(_call(job, shared))
            continue
        if not isinstance(job, msg.Init):
            reply(msg.Error(f"expected Init, got {type(job).__name__}"))
            continue
        shared.count_run(+1)
        try:
            if not _one_run(_Run(job, shared.client(job.uri), reply, shared), jobs):
                return
        finally:
            shared.count_run(-1)


@dataclass
class _Run:
    """One MLflow run being written: its Init, client, reply channel and (once started) id."""

    init: msg.Init
    client: Any
    reply: Reply
    shared: _Shared
    run_id: str | None = None
    failed: bool = False  # a job failed: a pending record (End.pending_file) stays for rlrun-wait

    @property
    def id(self) -> str:
        if self.run_id is None:
            raise RuntimeError("a job before the MLflow run was created")
        return self.run_id


def _one_run(run: _Run, jobs: queue.Queue[Any]) -> bool:
    """Serve one run's jobs until End (True: ready for the next run) or the trainer's EOF (False)."""
    while True:
        job = jobs.get()
        handler = HANDLERS.get(type(job))
        with run.shared.lock:  # see _Shared.lock
            try:
                if handler is None:
                    raise TypeError(f"unexpected message {type(job).__name__} inside a run")
                done = handler(run, job)
            except Exception as e:  # reported to the trainer, which stops the run
                run.failed = True
                run.reply(msg.Error(f"{type(job).__name__}: {_one_line(e)}"))
                if _DETACHED:  # no trainer to hear it: say it on stderr
                    print(f"rlrun: MLflow writer: {type(job).__name__}: {_one_line(e)}", file=sys.stderr, flush=True)
                done = isinstance(job, msg.End)
                if done:
                    run.reply(msg.Ended())
        if done:
            return not isinstance(job, msg.Eof)


def _on_eof(run: _Run, job: msg.Eof) -> bool:
    """The trainer died without ending the run."""
    if run.run_id is not None:
        run.client.set_terminated(run.run_id, "KILLED")
    return True


def _on_start(run: _Run, job: msg.Start) -> bool:
    import os

    from rlrun.provenance import process_start

    init, client = run.init, run.client
    # the run is alive while its trainer or this writer is (see reap_dead_runs)
    tags = {**job.tags, "rlrun.writer_pid": str(os.getpid()),
            "rlrun.writer_pid_start": process_start(os.getpid()) or ""}
    resume_id = init.resume_run_id or (run_with_key(client, init.resume_run_key) if init.resume_run_key else None)
    if resume_id:  # same run: params are immutable, so tags record changes
        run.run_id = resume_id
        client.update_run(run.run_id, status="RUNNING")
        for k, v in tags.items():
            client.set_tag(run.run_id, k, v)
        hist = client.get_metric_history(run.run_id, "timesteps_total")
        run.reply(msg.RunStarted(run.run_id, max((m.step for m in hist), default=-1),
                                 client.get_run(run.run_id).info.experiment_id))
    else:
        reap_dead_runs(client, init.experiment_name)
        run.run_id = create_run(client, init.experiment_name, init.artifact_location, init.run_name, tags,
                                init.uri, job.start_time_ms)
        run.reply(msg.RunStarted(run.run_id, -1, client.get_run(run.run_id).info.experiment_id))
        log_params(client, run.run_id, job.params)
    _warm_up(run.shared, model=init.log_model)
    return False


def _on_metrics(run: _Run, job: msg.Metrics) -> bool:
    from mlflow.entities import Metric

    ms = [Metric(k, v, ts, step) for metrics, step, ts in job.rows for k, v in metrics.items()]
    for i in range(0, len(ms), 1000):
        run.client.log_batch(run.id, metrics=ms[i : i + 1000])
    return False


def _on_artifacts(run: _Run, job: msg.Artifacts) -> bool:
    if not _link_into_local_store(run, job.local_dir, job.artifact_path):
        run.client.log_artifacts(run.id, job.local_dir, job.artifact_path)
    run.reply(msg.Uploaded(job.local_dir))
    return False


def _link_into_local_store(run: _Run, local_dir: str, artifact_path: str | None) -> bool:
    """A checkpoint into a local artifact store (the default ``mlartifacts/``) as hard links: the run
    dir and MLflow then share one copy on disk instead of two (checkpoint files are written once,
    atomically, and never changed). False - upload as usual - for remote stores, another file
    system, or links that fail."""
    import os
    import shutil
    from urllib.parse import unquote, urlparse

    uri = run.client.get_run(run.id).info.artifact_uri
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return False
    dest = Path(unquote(parsed.path)) / (artifact_path or "")
    if not artifact_path or dest.exists():
        return False
    staging = dest.with_name(dest.name + ".linking")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        if os.stat(local_dir).st_dev != os.stat(dest.parent).st_dev:
            return False
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(local_dir, staging, copy_function=os.link)
        staging.rename(dest)  # the checkpoint appears whole or not at all
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


def _on_artifact(run: _Run, job: msg.Artifact) -> bool:
    run.client.log_artifact(run.id, job.local_file, job.artifact_path)
    return False


def _on_model(run: _Run, job: msg.Model) -> bool:
    """A policy MLflow cannot export costs the model, not the run."""
    try:
        from rlrun.export import log_policy_model

        log_policy_model(run.init.uri, run.id, job.checkpoint_dir, job.launch_dir)
    except Exception as e:
        text = _one_line(e)[:5000]
        run.client.set_tag(run.id, "rlrun.model_error", text)
        print(f"rlrun: warning: the final policy was not logged as an MLflow model: {text}", file=sys.stderr,
              flush=True)
    return False


def _on_curve(run: _Run, job: msg.Curve) -> bool:
    log_curve(run.client, run.id, job.points, job.title, job.eval_points)
    return False


def _on_tags(run: _Run, job: msg.Tags) -> bool:
    for k, v in job.tags.items():
        run.client.set_tag(run.id, k, v)
    return False


def _on_end(run: _Run, job: msg.End) -> bool:
    run.client.set_terminated(run.id, job.status)
    run.reply(msg.Ended())
    if job.pending_file and not run.failed:  # complete: the record rlrun-wait would replay is not needed
        Path(job.pending_file).unlink(missing_ok=True)
    return True


HANDLERS: dict[type, Callable[[_Run, Any], bool]] = {
    msg.Eof: _on_eof, msg.Start: _on_start, msg.Metrics: _on_metrics, msg.Artifacts: _on_artifacts,
    msg.Artifact: _on_artifact, msg.Model: _on_model, msg.Curve: _on_curve, msg.Tags: _on_tags, msg.End: _on_end,
}


def _warm_up_plotting() -> None:
    """Import matplotlib while the trainer trains, so the end-of-run learning curve costs no wait."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


