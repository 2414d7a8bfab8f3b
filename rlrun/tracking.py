"""Tracking: MLflow (default, SQLite store, no server) or none; plus the console progress line.

The MLflow tracker does all its work on one background thread: importing mlflow, creating the
SQLite schema (~1.5 s on first use) and every ``log_batch`` overlap with training instead of
delaying it. Calls from the training loop only enqueue. An MLflow error is raised in the training
loop at the next call, so a broken store stops the run early instead of being ignored.
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlrun.config import TrackingConfig

MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
MAX_PARAM_VALUE = 6000  # MLflow's param value length limit (characters)
MAX_PARAM_KEY = 250


def default_tracking_uri(launch_dir: str | Path) -> str:
    """``sqlite:///<absolute launch dir>/mlflow.db``: absolute, so Ray workers and later shells agree."""
    return f"sqlite:///{Path(launch_dir).resolve() / 'mlflow.db'}"


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 1}}`` -> ``{"algo.lr": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def params_from_config(cfg: Mapping[str, Any]) -> dict[str, str]:
    """Flattened config as MLflow params, cut to MLflow's key/value length limits."""
    out = {}
    for k, v in flatten(cfg).items():
        s = "null" if v is None else str(v)
        if len(s) > MAX_PARAM_VALUE:
            s = s[: MAX_PARAM_VALUE - 3] + "..."
        out[k[:MAX_PARAM_KEY]] = s
    return out


def git_sha(cwd: str | Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def version_tags() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {"python": sys.version.split()[0]}
    for pkg in ("rlrun", "torch", "gymnasium", "numpy", "mlflow", "hydra-core"):
        try:
            tags[f"version.{pkg}"] = version(pkg)
        except PackageNotFoundError:
            tags[f"version.{pkg}"] = "not installed"
    return tags


class Tracker:
    """No-op tracker (``tracking=none``); also the interface."""

    run_id: str | None = None

    def start(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None: ...

    def log_artifact(self, local_file: str | Path, artifact_path: str | None = None) -> None: ...

    def check(self) -> None: ...

    def end(self, status: str = "FINISHED") -> None: ...


class TrackingError(RuntimeError):
    pass


class MlflowTracker(Tracker):
    """One MLflow run; every call runs in order on a background thread."""

    def __init__(self, cfg: TrackingConfig, launch_dir: str | Path, experiment_name: str) -> None:
        self.uri = cfg.tracking_uri or default_tracking_uri(launch_dir)
        if self.uri.startswith("sqlite:///"):
            db = Path(self.uri[len("sqlite:///"):])
            if not db.is_absolute():
                raise TrackingError(f"tracking.tracking_uri: a SQLite path must be absolute, got {self.uri}")
            self.artifact_location = cfg.artifact_location or (db.parent / "mlartifacts").as_uri()
        else:
            self.artifact_location = cfg.artifact_location
        self.experiment_name = cfg.experiment_name or experiment_name
        self.run_name = cfg.run_name
        self.run_id = None
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlrun-mlflow", daemon=True)
        self._thread.start()

    # -- thread side
    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            if self._error is not None:
                continue  # drop work after a failure; the error is re-raised on the caller side
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - surfaced in check()/end()
                self._error = e
                self._ready.set()

    def _start(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient(tracking_uri=self.uri)
        exp = client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            exp_id = client.create_experiment(self.experiment_name, artifact_location=self.artifact_location)
        else:
            exp_id = exp.experiment_id
        run = client.create_run(exp_id, run_name=self.run_name, tags=dict(tags))
        self.run_id = run.info.run_id
        self._ready.set()
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def _log(self, metrics: Mapping[str, float], step: int, ts: int) -> None:
        from mlflow.entities import Metric

        ms = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(ms), 1000):
            self._client.log_batch(self.run_id, metrics=ms[i : i + 1000])

    # -- caller side
    def start(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        self._q.put(lambda: self._start(params, tags))

    def wait_started(self, timeout: float = 120.0) -> str:
        """Block until the MLflow run exists; returns its id."""
        self._ready.wait(timeout)
        self.check()
        if self.run_id is None:
            raise TrackingError(f"MLflow run was not created within {timeout:.0f} s ({self.uri})")
        return self.run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items()
                 if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
        ts = int(time.time() * 1000)
        self._q.put(lambda: self._log(clean, step, ts))

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self._q.put(lambda: self._client.log_artifacts(self.run_id, str(local_dir), artifact_path))

    def log_artifact(self, local_file: str | Path, artifact_path: str | None = None) -> None:
        self._q.put(lambda: self._client.log_artifact(self.run_id, str(local_file), artifact_path))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        def job() -> None:
            for k, v in tags.items():
                self._client.set_tag(self.run_id, k, v)
        self._q.put(job)

    def check(self) -> None:
        if self._error is not None:
            err = self._error
            raise TrackingError(f"MLflow tracking failed ({self.uri}): {type(err).__name__}: {err}") from err

    def end(self, status: str = "FINISHED") -> None:
        def finish() -> None:
            if self.run_id is not None:
                self._client.set_terminated(self.run_id, status)
        self._q.put(finish)
        self._q.put(None)
        self._thread.join()
        self.check()


def make_tracker(cfg: TrackingConfig, launch_dir: str | Path, experiment_name: str) -> Tracker:
    if cfg.backend == "none":
        return Tracker()
    return MlflowTracker(cfg, launch_dir, experiment_name)


class ProgressLine:
    """A live one-line status on a terminal; a plain line every ``every_s`` seconds otherwise."""

    def __init__(self, enabled: bool = True, every_s: float = 5.0) -> None:
        self.enabled = enabled
        self.tty = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        self.every_s = every_s
        self._last = 0.0
        self._status: Any = None

    def _text(self, r: Mapping[str, float]) -> str:
        ret = r.get("rollout/episode_return_mean", math.nan)
        return (f"iter {int(r['training_iteration']):>5}  steps {int(r['timesteps_total']):>9,}  "
                f"return {ret:8.2f}  {r.get('time/env_steps_per_s', 0.0):>8,.0f} steps/s  "
                f"{r['time_total_s']:7.1f} s")

    def update(self, r: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self._status is None:
                from rich.console import Console

                self._status = Console(stderr=False).status("", spinner="dots")
                self._status.start()
            self._status.update(self._text(r))
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            print(self._text(r), flush=True)

    def close(self, r: Mapping[str, float] | None, reason: str) -> None:
        if self._status is not None:
            self._status.stop()
        if self.enabled and r is not None:
            print(f"{self._text(r)}  -> stopped: {reason}", flush=True)
