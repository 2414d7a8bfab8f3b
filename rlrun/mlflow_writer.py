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
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rlrun.tracking import MAX_PARAMS_PER_BATCH, TrackingError


def run(fd: int) -> None:
    """Entry point: ``main``, then exit at once (every write is committed by then; skipping the
    interpreter's teardown saves a second or more with torch and mlflow loaded)."""
    import os

    try:
        main(fd)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


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
        listener = Listener(address, family="AF_UNIX")
        print(address, flush=True)  # ready: the driver waits for this line
        os.dup2(2, 1)  # anything printed later goes where the driver's errors go, not into a pipe no one reads

        def accept() -> None:
            while True:
                try:
                    conn = listener.accept()
                except OSError:
                    return
                threading.Thread(target=_serve, args=(conn, shared), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        threading.Thread(target=_warm_up_all, args=(shared,), daemon=True).start()

        sys.stdin.read()  # until the driver closes it
        deadline = time.monotonic() + 600
        while shared.open_runs and time.monotonic() < deadline:
            time.sleep(0.1)
        listener.close()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(address)
            os.rmdir(os.path.dirname(address))
        os._exit(0)


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
            from mlflow.tracking import MlflowClient

            return self.clients.get(uri) or self.clients.setdefault(uri, MlflowClient(tracking_uri=uri))

    def count_run(self, delta: int) -> None:
        with self.books:
            self.open_runs += delta


def _warm_up_all(shared: _Shared) -> None:
    """A sweep's writer: import and warm up now, while the sweep sets up, not in its first jobs (mlflow
    first: the driver's parent run waits for it)."""
    with shared.lock:
        import mlflow.tracking  # noqa: F401

        import rlrun.sweep  # noqa: F401  # the driver's calls
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


def _call(name: str, kwargs: dict[str, Any], shared: _Shared) -> tuple[str, Any]:
    try:
        with shared.lock:
            from rlrun.sweep import WRITER_CALLS

            return ("result", WRITER_CALLS[name](**kwargs))
    except Exception as e:
        return ("error", f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        shared.parent_done.set()


def _quiet() -> None:
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; we finish writing
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _serve(conn: Connection, shared: _Shared) -> None:
    """One trainer's runs, each run's jobs in order; a reader thread keeps the socket drained meanwhile."""
    import threading

    jobs: queue.Queue[tuple[Any, ...]] = queue.Queue()

    def reader() -> None:
        try:
            while True:
                jobs.put(conn.recv())
        except (EOFError, OSError):
            jobs.put(("eof",))

    threading.Thread(target=reader, daemon=True).start()

    def reply(msg: tuple[Any, ...]) -> None:  # best effort: a dead trainer must not stop the bookkeeping
        with contextlib.suppress(OSError):
            conn.send(msg)

    try:
        _serve_jobs(jobs, reply, shared)
    except Exception as e:  # a bug here must not leave the trainer waiting for replies that never come
        reply(("error", f"MLflow writer: {type(e).__name__}: {e}"))
        conn.close()
        raise


def _serve_jobs(jobs: queue.Queue[tuple[Any, ...]], reply: Any, shared: _Shared) -> None:
    while True:
        job = jobs.get()
        if job[0] == "eof":
            return
        if job[0] == "call":  # the sweep driver's MLflow work (rlrun.sweep.WRITER_CALLS)
            reply(_call(job[1], job[2], shared))
            continue
        if job[0] != "init":
            reply(("error", f"expected 'init', got '{job[0]}'"))
            continue
        shared.count_run(+1)
        try:
            if not _one_run(job, jobs, reply, shared.client(job[1]), shared):
                return
        finally:
            shared.count_run(-1)


def _one_run(init: tuple[Any, ...], jobs: queue.Queue[tuple[Any, ...]], reply: Any, client: Any,
             shared: _Shared) -> bool:
    """Serve one run's jobs until "end" (True: ready for the next run) or the trainer's EOF (False)."""
    with shared.lock:
        from mlflow.entities import Metric

    _, uri, artifact_location, experiment_name, run_name, resume_run_id, log_model = init
    run_id = None
    while True:
        job = jobs.get()
        kind = job[0]
        with shared.lock:  # see _Shared.lock
            try:
                if kind == "eof":  # the trainer died without ending the run
                    if run_id is not None:
                        client.set_terminated(run_id, "KILLED")
                    return False
                if kind == "start" and resume_run_id:  # same run: params are immutable, so tags record changes
                    _, params, tags = job
                    run_id = resume_run_id
                    client.update_run(run_id, status="RUNNING")
                    for k, v in tags.items():
                        client.set_tag(run_id, k, v)
                    hist = client.get_metric_history(run_id, "timesteps_total")
                    reply(("run_id", (run_id, max((m.step for m in hist), default=-1))))
                    _warm_up(shared, model=log_model)
                elif kind == "start":
                    _, params, tags = job
                    run_id = create_run(client, experiment_name, artifact_location, run_name, tags)
                    reply(("run_id", (run_id, -1)))
                    log_params(client, run_id, params)
                    _warm_up(shared, model=log_model)
                elif run_id is None:
                    raise TrackingError(f"'{kind}' before the MLflow run was created")
                elif kind == "metrics":
                    ms = [Metric(k, v, ts, step) for metrics, step, ts in job[1] for k, v in metrics.items()]
                    for i in range(0, len(ms), 1000):
                        client.log_batch(run_id, metrics=ms[i : i + 1000])
                elif kind == "artifacts":
                    client.log_artifacts(run_id, job[1], job[2])
                    reply(("uploaded", job[1]))
                elif kind == "artifact":
                    client.log_artifact(run_id, job[1], job[2])
                elif kind == "model":  # a policy MLflow cannot export costs the model, not the run
                    try:
                        from rlrun.export import log_policy_model

                        log_policy_model(uri, run_id, job[1], job[2])
                    except Exception as e:
                        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:5000]
                        client.set_tag(run_id, "rlrun.model_error", msg)
                        print(f"rlrun: warning: the final policy was not logged as an MLflow model: {msg}",
                              file=sys.stderr, flush=True)
                elif kind == "curve":
                    _log_curve(client, run_id, job[1], job[2], job[3])
                elif kind == "tags":
                    for k, v in job[1].items():
                        client.set_tag(run_id, k, v)
                elif kind == "end":
                    client.set_terminated(run_id, job[1])
                    reply(("ended", None))
                    return True
            except Exception as e:  # reported to the trainer, which stops the run
                reply(("error", f"{kind}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                if kind == "end":
                    reply(("ended", None))
                    return True


def create_run(client: Any, experiment_name: str, artifact_location: str | None, run_name: str | None,
               tags: dict[str, str]) -> str:
    """A new run in ``experiment_name`` (the experiment is created on first use); its id."""
    exp = client.get_experiment_by_name(experiment_name)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment_name,
                                                                    artifact_location=artifact_location)
    run_id: str = client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
    return run_id


def log_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])


def _warm_up_plotting() -> None:
    """Import matplotlib while the trainer trains, so the end-of-run learning curve costs no wait."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


def _log_curve(client: Any, run_id: str, points: list[tuple[float, float]], title: str,
               eval_points: list[tuple[float, float]]) -> None:
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], label="training (mean of last 100 episodes)")
    if eval_points:
        ax.plot([p[0] for p in eval_points], [p[1] for p in eval_points], "o", label="greedy evaluation")
    ax.legend(loc="lower right")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return (mean of last 100)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "learning_curve.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        client.log_artifact(run_id, str(path))
