"""The jobs of one MLflow run inside the writer process (rlrun/tracking/writer.py serves them): start
or resume the run, metrics, artifacts (hard links into a local store), tags, the learning curve,
the model, the end. Each handler returns True when the run is over."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlrun.core.errors import one_line
from rlrun.tracking import writer_messages as msg
from rlrun.tracking.mlflow_runs import create_run, log_curve, log_params, reap_dead_runs, run_with_key

Reply = Callable[[Any], None]


@dataclass
class RunJobs:
    """One MLflow run being written: its Init, client, reply channel and (once started) id."""

    init: msg.Init
    client: Any
    reply: Reply
    shared: Any  # rlrun.tracking.writer._Shared: its lock, warm_up(model)
    detached: threading.Event  # the trainer has returned without waiting: errors go to stderr
    run_id: str | None = None
    failed: bool = False  # a job failed: a pending record (End.pending_file) stays for rlrun-wait

    @property
    def id(self) -> str:
        if self.run_id is None:
            raise RuntimeError("a job before the MLflow run was created")
        return self.run_id


def one_run(run: RunJobs, jobs: queue.Queue[Any]) -> bool:
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
                run.reply(msg.Error(f"{type(job).__name__}: {one_line(e)}"))
                if run.detached.is_set():  # no trainer to hear it: say it on stderr
                    print(f"rlrun: MLflow writer: {type(job).__name__}: {one_line(e)}", file=sys.stderr, flush=True)
                done = isinstance(job, msg.End)
                if done:
                    run.reply(msg.Ended())
        if done:
            return not isinstance(job, msg.Eof)


def _on_eof(run: RunJobs, job: msg.Eof) -> bool:
    """The trainer died without ending the run: KILLED, unless another writer has taken the run over since (a
    Tune trial resumed in another actor while this one sat in Tune's actor cache: rlrun/app/tune_trainable.py)."""
    if run.run_id is not None and _holds(run):
        run.client.set_terminated(run.run_id, "KILLED")
    return True


def _holds(run: RunJobs) -> bool:
    import os

    holder = run.client.get_run(run.id).data.tags.get("rlrun.writer_pid")
    return holder in (None, str(os.getpid()))


def _on_start(run: RunJobs, job: msg.Start) -> bool:
    import os

    from rlrun.core.liveness import process_start

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
    run.shared.warm_up(model=init.log_model)
    return False


def _on_metrics(run: RunJobs, job: msg.Metrics) -> bool:
    from mlflow.entities import Metric

    ms = [Metric(k, v, ts, step) for metrics, step, ts in job.rows for k, v in metrics.items()]
    for i in range(0, len(ms), 1000):
        run.client.log_batch(run.id, metrics=ms[i : i + 1000])
    return False


def _on_artifacts(run: RunJobs, job: msg.Artifacts) -> bool:
    if not _link_into_local_store(run, job.local_dir, job.artifact_path):
        run.client.log_artifacts(run.id, job.local_dir, job.artifact_path)
    run.reply(msg.Uploaded(job.local_dir))
    return False


def _link_into_local_store(run: RunJobs, local_dir: str, artifact_path: str | None) -> bool:
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
    if not artifact_path:
        return False
    if dest.exists():  # linked before (a record replayed after its writer died): done if every file is ours
        return _already_linked(Path(local_dir), dest)
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


def _already_linked(local_dir: Path, dest: Path) -> bool:
    import os

    try:
        return all(os.path.samefile(f, dest / f.relative_to(local_dir)) for f in local_dir.rglob("*") if f.is_file())
    except OSError:
        return False


def _on_artifact(run: RunJobs, job: msg.Artifact) -> bool:
    run.client.log_artifact(run.id, job.local_file, job.artifact_path)
    return False


def _on_model(run: RunJobs, job: msg.Model) -> bool:
    """A policy MLflow cannot export costs the model, not the run."""
    try:
        if job.actors_dir is not None and Path(job.actors_dir).is_dir():  # traced by the trainer: no torch here
            from rlrun.tracking.model_files import log_saved_actors

            log_saved_actors(run.init.uri, run.id, job.actors_dir)
        else:
            from rlrun.training.export import log_policy_model

            log_policy_model(run.init.uri, run.id, job.checkpoint_dir, job.launch_dir)
    except Exception as e:
        text = one_line(e)[:5000]
        run.client.set_tag(run.id, "rlrun.model_error", text)
        print(f"rlrun: warning: the final policy was not logged as an MLflow model: {text}", file=sys.stderr,
              flush=True)
    return False


def _on_curve(run: RunJobs, job: msg.Curve) -> bool:
    log_curve(run.client, run.id, job.points, job.title, job.eval_points, job.window)
    return False


def _on_tags(run: RunJobs, job: msg.Tags) -> bool:
    for k, v in job.tags.items():
        run.client.set_tag(run.id, k, v)
    return False


def _on_end(run: RunJobs, job: msg.End) -> bool:
    if job.status:  # '' : the trainer lets go of the run, which goes on elsewhere (Tracker.end(''))
        run.client.set_terminated(run.id, job.status)
    run.reply(msg.Ended())
    if job.pending_file and not run.failed:  # complete: the record rlrun-wait would replay is not needed
        Path(job.pending_file).unlink(missing_ok=True)
    return True


HANDLERS: dict[type, Callable[[RunJobs, Any], bool]] = {
    msg.Eof: _on_eof, msg.Start: _on_start, msg.Metrics: _on_metrics, msg.Artifacts: _on_artifacts,
    msg.Artifact: _on_artifact, msg.Model: _on_model, msg.Curve: _on_curve, msg.Tags: _on_tags, msg.End: _on_end,
}
