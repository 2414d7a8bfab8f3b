"""Sweeps (``rlrun -m ...``): one MLflow parent run per sweep, one child run per job.

The driver (Hydra callback ``SweepCallback``, configured in conf/config.yaml) creates the SQLite
store, the experiment and the parent run *before* any job starts (two clients migrating a fresh
store at once corrupt it), logs the sweep's overrides and ``multirun.yaml`` to the parent, and
writes ``<sweep dir>/rlrun_sweep.json`` so every job - in this process (basic launcher) or in a Ray
task (ray launcher) - finds the parent. A job that fails (bad value, NaN loss, env error) becomes a
FAILED child with the message in ``rlrun.error`` and its console log as ``job.log``; it returns NaN
so the sweep goes on (Optuna records NaN as a failed trial). At the end the parent gets the summary
(rlrun/tracking/report.py) and ends FINISHED, or FAILED when every job failed.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rlrun.config.schemas import DEFAULT_EXPERIMENT
from rlrun.core.sweep_info import SWEEP_FILE, SweepInfo, SweepJob, read_sweep_info
from rlrun.tracking import writer_messages as msg


@dataclass
class SweepOutcome:  # the driver's view of the current sweep, for Ctrl-C and the exit status
    info: SweepInfo | None = None
    total: int = 0
    failed: list[str] = field(default_factory=list)
    writer: Any = None  # the shared MLflow writer process
    writer_dir: str | None = None  # its private socket directory


def _stop_shared_writer() -> None:
    """The jobs are over: the shared writer finishes what it was sent, then exits."""
    from rlrun.tracking.tracker import use_shared_writer

    use_shared_writer(None)
    proc, OUTCOME.writer = OUTCOME.writer, None
    if proc is None or proc.stdin is None:
        return
    proc.stdin.close()
    try:
        proc.wait(timeout=120)  # it finishes the runs it was sent, then removes its socket dir itself
    except subprocess.TimeoutExpired:
        proc.kill()
    if OUTCOME.writer_dir:  # and if it could not (killed): nothing of the sweep stays in /tmp
        import shutil

        shutil.rmtree(OUTCOME.writer_dir, ignore_errors=True)


OUTCOME = SweepOutcome()


def _tracking_target(config: DictConfig) -> tuple[str, str, str | None] | None:
    """(tracking uri, experiment name, artifact location) for the sweep, or None with tracking=none."""
    from rlrun.tracking.tracker import store_locations

    tr = config.get("tracking") or {}
    if tr.get("backend", "mlflow") != "mlflow":
        return None
    uri, artifacts = store_locations(tr.get("tracking_uri"), tr.get("artifact_location"), config.hydra.runtime.cwd)
    name = tr.get("experiment_name") or config.hydra.runtime.choices.get("experiment") or DEFAULT_EXPERIMENT
    return uri, str(name), artifacts


def sweep_params(overrides: list[str]) -> dict[str, str]:
    """``["seed=0,1,2", "algo.lr=1e-3,3e-4"]`` -> ``{"sweep.seed": "0,1,2", ...}`` (parent run params)."""
    out = {}
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep:
            out[f"sweep.{key.lstrip('+~')}"[:250]] = value[:6000]
    return out


class SweepCallback(Callback):
    """Driver side of a sweep: parent run before the jobs, summary after them."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "optuna" in str(config.hydra.sweeper.get("_target_", "")):
            from rlrun.core.quiet import quiet_optuna

            quiet_optuna()
        start_sweep(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finish_sweep(config)


def start_sweep(config: DictConfig) -> SweepInfo | None:
    OUTCOME.__init__()  # type: ignore[misc]  # a fresh record per sweep in this process
    target = _tracking_target(config)
    sweep_dir = Path(config.hydra.sweep.dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if target is None:
        start_ray_early(config, None)
        return None
    from rlrun.tracking.tracker import use_shared_writer

    # one MLflow writer process for every job on this machine (not one per Ray worker): it imports
    # mlflow while the parent run is created and Ray starts
    OUTCOME.writer, address = start_shared_writer()
    OUTCOME.writer_dir = str(Path(address).parent)
    use_shared_writer(address)  # jobs in this process (basic launcher)
    made: list[SweepInfo | BaseException] = []

    def make_parent() -> None:
        try:
            made.append(_create_parent(config, target, sweep_dir, address))
        except BaseException as e:  # re-raised on the main thread
            made.append(e)

    setup = threading.Thread(target=make_parent)  # mlflow's import overlaps Ray's start-up
    setup.start()
    try:
        start_ray_early(config, address)
    finally:
        setup.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    info = OUTCOME.info = made[0]
    print(f"rlrun: sweep -> MLflow parent run {info.parent_run_id} (experiment '{info.experiment_name}', "
          f"{info.tracking_uri})", flush=True)
    return info


def start_shared_writer() -> tuple[subprocess.Popen[str], str]:
    """Start a sweep's shared writer process; returns it and its socket address once it listens.
    Closing its stdin ends it (after the runs it is writing)."""
    import os
    import tempfile

    from rlrun.tracking.tracker import TrackingError, spawn_writer

    address = os.path.join(tempfile.mkdtemp(prefix="rlrun-"), "writer.sock")  # short: AF_UNIX paths < 108 bytes
    msg.new_authkey(address)
    proc: subprocess.Popen[str] = spawn_writer("serve", address, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != address:  # it listens (before importing mlflow): ~0.1 s
        proc.kill()
        raise TrackingError(f"the sweep's MLflow writer did not start (exit code {proc.wait()})")
    return proc, address


def _create_parent(config: DictConfig, target: tuple[str, str, str | None], sweep_dir: Path,
                   writer_address: str | None) -> SweepInfo:
    uri, name, artifacts = target
    overrides = list(config.hydra.overrides.task)
    hc = config.hydra
    tags = {
        "rlrun.sweep": "true", "rlrun.sweep_dir": str(sweep_dir.resolve()),
        "rlrun.sweep_overrides": " ".join(overrides)[:5000],
        "rlrun.launcher": str(hc.launcher.get("_target_", "")), "rlrun.sweeper": str(hc.sweeper.get("_target_", "")),
        "mlflow.note.content": f"Sweep `rlrun -m {' '.join(overrides)}`; jobs are the child runs. "
                               f"Summary: `sweep_summary.md`, `sweep_returns.png`.",
    }
    (sweep_dir / "multirun.yaml").write_text(OmegaConf.to_yaml(config))  # Hydra rewrites it identically
    kwargs = {"uri": uri, "experiment_name": name, "artifact_location": artifacts,
              "run_name": f"sweep {time.strftime('%Y-%m-%d %H:%M:%S')}", "tags": tags,
              "params": sweep_params(overrides), "files": [str(sweep_dir / "multirun.yaml")]}
    run_id = _in_writer(writer_address, "create_parent_run", kwargs)
    info = SweepInfo(run_id, uri, name, str(config.hydra.runtime.cwd), str(sweep_dir.resolve()), writer_address)
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(asdict(info), indent=2))
    return info


def _in_writer(address: str | None, name: str, kwargs: dict[str, Any]) -> Any:
    """``name(**kwargs)`` (one of ``mlflow_runs.WRITER_CALLS``) in the sweep's shared MLflow writer,
    which has mlflow imported already (so the driver never imports it), or here when there is none."""
    if address is None:
        from rlrun.tracking.mlflow_runs import WRITER_CALLS

        return WRITER_CALLS[name](**kwargs)
    from multiprocessing.connection import Client

    with Client(address, family="AF_UNIX", authkey=msg.read_authkey(address)) as conn:
        conn.send(msg.Call(name, kwargs))
        reply = conn.recv()
    if isinstance(reply, msg.Error):
        from rlrun.tracking.tracker import TrackingError

        raise TrackingError(f"MLflow ({kwargs.get('uri')}): {reply.message}")
    return reply.value


def start_ray_early(config: DictConfig, writer_address: str | None) -> None:
    """With ``hydra/launcher=ray``: start Ray now, with the launcher's own ``ray.init`` settings (the
    launcher then finds it running), and warm one Ray worker per job slot (imports, connection to the
    shared MLflow writer) while the driver is still setting up (the parent run is created meanwhile, on
    another thread); otherwise each waits for the one before.

    Where the jobs start Ray actors of their own (rollout workers), the warm-up tasks are waited for
    before this returns, so the launcher submits the jobs after them. The tasks hold the jobs' CPUs
    while they run, and Ray gives a CPU one of them frees to any waiting request - the first job's
    rollout actor, say, before the second job: on a loaded CI machine the second job of a two-slot
    sweep twice started only after the first had ended (by 2026-11-26, and 2026-11-29; the likely cause,
    not seen in Ray's logs). Jobs would wait for these CPUs anyway, but the wait costs the overlap of the
    jobs' submission with the warm-up (~1 s), so jobs without actors (nothing to take their CPUs) do not
    wait. A failed warm-up is left to the job that meets the same failure."""
    launcher = config.hydra.launcher
    if "hydra_ray_launcher" not in str(launcher.get("_target_", "")):
        return
    import ray

    if ray.is_initialized():
        return
    init: Any = OmegaConf.to_container(launcher.ray.init, resolve=True)
    init.setdefault("object_store_memory", 78643200)  # what the launcher itself would pass (75 MiB)
    if init.get("address") is None:
        from rlrun.sources.ray_instance import PRIVATE_SYSTEM_CONFIG, keep_on_loopback, private_temp_dir

        keep_on_loopback()
        init.setdefault("_temp_dir", private_temp_dir())
        init.setdefault("_system_config", dict(PRIVATE_SYSTEM_CONFIG))
    from rlrun.core.quiet import verbose

    if not verbose():
        init.setdefault("logging_level", logging.WARNING)  # not "Started a local Ray instance." on every sweep
    ray.init(**init)
    cpus = float(launcher.ray.get("remote", {}).get("num_cpus", 1) or 1)
    slots = max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
    warm = ray.remote(num_cpus=cpus)(warm_worker)
    warming = [warm.remote(writer_address) for _ in range(slots)]
    if _jobs_may_start_actors(config):
        ray.wait(warming, num_returns=len(warming), timeout=300.0)


def _jobs_may_start_actors(config: DictConfig) -> bool:
    """Whether a job of this sweep may start Ray rollout workers: the composed config has some, or the
    sweep varies the rollout section or the experiment (which may choose ``rollout=ray``)."""
    if int(OmegaConf.select(config, "rollout.num_workers", default=0) or 0) > 0:
        return True
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    except Exception:  # Hydra parsed these already; should its parser differ, wait rather than guess
        return True
    return any(o.is_sweep_override() and o.key_or_group.startswith(("rollout", "experiment")) for o in overrides)


def warm_worker(writer_address: str | None) -> None:
    """In a Ray worker: import what a job needs and connect to the MLflow writer."""
    import rlrun.app.compose
    import rlrun.app.runner  # noqa: F401
    from rlrun.tracking.tracker import _IDLE_WRITERS, _take_writer, use_shared_writer

    use_shared_writer(writer_address)
    _IDLE_WRITERS.append(_take_writer())


def finish_sweep(config: DictConfig) -> None:
    sweep_dir = Path(config.hydra.sweep.dir)
    info = read_sweep_info(sweep_dir)
    try:
        if info is not None:
            args = {"uri": info.tracking_uri, "parent_run_id": info.parent_run_id, "sweep_dir": str(sweep_dir)}
            out = _in_writer(info.writer_address if OUTCOME.writer else None, "close_parent_run", args)
            print(out["text"], end="", flush=True)
            OUTCOME.total, OUTCOME.failed = out["total"], out["failed"]
    finally:
        _stop_shared_writer()


def end_interrupted_sweep() -> None:
    """Ctrl-C during a sweep: the parent run ends KILLED instead of staying RUNNING."""
    info = OUTCOME.info
    try:
        if info is not None:
            _in_writer(info.writer_address if OUTCOME.writer else None, "end_parent_run",
                       {"uri": info.tracking_uri, "parent_run_id": info.parent_run_id, "status": "KILLED"})
    finally:
        _stop_shared_writer()


class Tee:
    """Copies what a job prints to its ``job.log`` (the artifact of a failed or finished child)."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        self.log.write(s)
        self.log.flush()
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return False  # a job's progress goes out as plain lines

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def record_failed_job(job: SweepJob, error: str) -> None:
    """A job that failed before its MLflow run existed (e.g. config validation) still gets a
    FAILED child run, with the message and its log."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=job.info.tracking_uri)
    exp = client.get_experiment_by_name(job.info.experiment_name)
    if exp is None:
        print(f"rlrun: MLflow experiment '{job.info.experiment_name}' is gone; job not recorded", file=sys.stderr)
        return
    tags = {**job.tags, "rlrun.error": error[:5000], "mlflow.note.content": f"Failed: {error}"[:5000]}
    child = client.create_run(exp.experiment_id, run_name=job.tags.get("mlflow.runName"), tags=tags)
    if job.log_file is not None and job.log_file.is_file():
        client.log_artifact(child.info.run_id, str(job.log_file))
    client.set_terminated(child.info.run_id, "FAILED")
