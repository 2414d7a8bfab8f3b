"""MLflow jobs done by the writer process: runs, params, the learning curve, and a sweep's parent run.

The writer (rlrun/tracking/writer.py) calls these with mlflow imported; a sweep driver asks for the
parent-run jobs by name (``WRITER_CALLS``), so it never imports mlflow itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlrun.core.cache import cache_root

MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock on a SQLite store (``<db>.lock`` beside it) across processes: the first-time
    schema migration and experiment creation must happen once, not in several runs at once (two
    concurrent migrations leave a store half-migrated for good). Other stores need none."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    lock_path = Path(uri[len("sqlite:///"):]).with_name(Path(uri).name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def open_store(uri: str) -> Any:
    """An MlflowClient whose store exists and is migrated (done under ``store_lock``)."""
    import logging

    from mlflow.tracking import MlflowClient

    # "Creating initial MLflow database tables..." and alembic's migration steps: INFO lines from another
    # process, glued into the trainer's console output; warnings and errors still show
    for name in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with store_lock(uri):
        if uri.startswith("sqlite:///"):
            _create_sqlite_store(Path(uri[len("sqlite:///"):]))
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # creates / migrates the schema now, under the lock
    return client


def _create_sqlite_store(path: Path) -> None:
    """A new SQLite store is created and migrated under a temporary name, then renamed into place:
    MLflow's first-time migrations take seconds and commit step by step, so a kill of the writer
    among them (a process-group SIGKILL a few seconds into a run) would otherwise leave a
    half-migrated store that every later run refuses ("table ... already exists"). Under ``store_lock``.
    The migrations run once per MLflow version on this machine: the empty store they make is kept
    (``store_template``) and copied for the next new store (1.5-2.4 s -> ~0.1 s of the writer's
    critical path, measured on this 2-core machine: every first run in a new directory pays it)."""
    if path.exists():
        return
    from mlflow.tracking import MlflowClient

    tmp = path.with_name(path.name + ".creating")
    copy = path.with_name(path.name + ".copying")  # its own name: MLflow keeps a connection per store URI
    for leftover in (tmp, copy, *(f.with_name(f.name + "-journal") for f in (tmp, copy))):  # of a killed creation
        leftover.unlink(missing_ok=True)
    template = store_template()
    if template and _copy_template(template, copy):
        os.replace(copy, path)
        return
    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
    if template:
        _keep_template(tmp, template)
    os.replace(tmp, path)


def store_template() -> Path | None:
    """Where this machine keeps an empty, migrated SQLite store of the installed MLflow version
    (``$RLRUN_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlrun``, else ``~/.cache/rlrun``)."""
    import mlflow

    root = cache_root()
    return None if root is None else Path(root) / f"mlflow-{mlflow.__version__}-empty.db"


def _copy_template(template: Path, tmp: Path) -> bool:
    """``tmp`` a copy of the template, its Default experiment (id 0) given the artifact location
    and times MLflow would have given it here; checked by opening it as MLflow does (a schema it
    does not take is refused there). False, nothing left at ``tmp``, where any of it fails."""
    import shutil
    import sqlite3
    import time

    from mlflow.tracking import MlflowClient

    try:
        shutil.copyfile(template, tmp)
        store = MlflowClient(tracking_uri=f"sqlite:///{tmp}")._tracking_client.store
        now = int(time.time() * 1000)
        with contextlib.closing(sqlite3.connect(tmp)) as db, db:
            db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                       "WHERE experiment_id = 0", (store._get_artifact_location(0), now, now))
        return True
    except Exception:  # a template this MLflow cannot use: migrate as usual
        tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            template.unlink()
        return False


def _keep_template(store: Path, template: Path) -> None:
    """A copy of the just-migrated, still empty ``store`` as the template (written whole, then renamed:
    another process never reads half of it). Nowhere to keep it: the next new store migrates again."""
    import shutil

    part = template.with_name(f"{template.name}.{os.getpid()}.part")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(store, part)
        os.replace(part, template)
    except OSError:
        part.unlink(missing_ok=True)


# MLflow 3's UI opens an experiment in its GenAI view (traces, token usage) unless this tag says otherwise
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def create_run(client: Any, experiment_name: str, artifact_location: str | None, run_name: str | None,
               tags: dict[str, str], uri: str = "", start_time_ms: int | None = None) -> str:
    """A new run in ``experiment_name`` (the experiment is created on first use, under the store's
    lock: two runs creating it at once would collide); its id."""
    with store_lock(uri):
        exp = client.get_experiment_by_name(experiment_name)
        if exp is None:
            exp_id = client.create_experiment(experiment_name, artifact_location=artifact_location,
                                              tags=EXPERIMENT_KIND)
        else:
            exp_id = exp.experiment_id
            for k, v in EXPERIMENT_KIND.items():
                if exp.tags.get(k) != v:  # an experiment made by an older rlrun or by hand
                    client.set_experiment_tag(exp_id, k, v)
    run_id: str = client.create_run(exp_id, start_time=start_time_ms, run_name=run_name, tags=tags).info.run_id
    return run_id


RUN_KEY_TAG = "rlrun.run_key"  # rlrun's own name for a run, known before MLflow has created it


def run_with_key(client: Any, run_key: str) -> str | None:
    """The MLflow run tagged ``rlrun.run_key = run_key`` (in any experiment), if there is one."""
    if not re.fullmatch(r"[0-9a-f]{32}", run_key):
        return None
    exp_ids = [e.experiment_id for e in client.search_experiments(max_results=10000)]
    runs = client.search_runs(exp_ids, f"tags.`{RUN_KEY_TAG}` = '{run_key}'", max_results=1) if exp_ids else []
    return runs[0].info.run_id if runs else None


def reap_dead_runs(client: Any, experiment_name: str) -> list[str]:
    """Mark KILLED the RUNNING runs of ``experiment_name`` whose trainer and writer processes on this
    host are both gone (killed together, e.g. by the OOM killer; a run whose trainer has returned is
    alive while its writer finishes it in the background); returns their ids."""
    import socket

    from rlrun.core.liveness import still_running

    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        return []
    host = socket.gethostname()
    reaped = []
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        tags = run.data.tags
        if tags.get("rlrun.host") != host or not tags.get("rlrun.pid", "").isdigit():
            continue
        if any(still_running(tags.get(f"rlrun.{who}pid", ""), tags.get(f"rlrun.{who}pid_start"))
               for who in ("", "writer_")):
            continue
        client.set_tag(run.info.run_id, "rlrun.stop_reason", "the trainer process is gone (killed)")
        client.set_terminated(run.info.run_id, "KILLED")
        reaped.append(run.info.run_id)
    return reaped


def log_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])


def create_parent_run(uri: str, experiment_name: str, artifact_location: str | None, run_name: str,
                      tags: dict[str, str], params: dict[str, str], files: list[str]) -> str:
    """The sweep's parent run (and the store and experiment, once, before any job); its id."""
    client = open_store(uri)
    run_id = create_run(client, experiment_name, artifact_location, run_name, tags, uri)
    log_params(client, run_id, params)
    for f in files:
        client.log_artifact(run_id, f)
    return run_id


def close_parent_run(uri: str, parent_run_id: str, sweep_dir: str) -> dict[str, Any]:
    """The summary (files, artifacts), Optuna's best parameters, the parent's final status. Returns
    the text to print and the jobs' outcome."""
    import contextlib
    import io

    from mlflow.tracking import MlflowClient

    from rlrun.tracking.report import write_report

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        summary = write_report(parent_run_id, uri, sweep_dir)
        client = MlflowClient(tracking_uri=uri)
        best = Path(sweep_dir) / "optimization_results.yaml"  # hydra-optuna-sweeper's best parameters
        if best.is_file():
            client.log_artifact(parent_run_id, str(best))
            res = OmegaConf.to_container(OmegaConf.load(best))
            if isinstance(res, dict) and "best_params" in res:
                client.set_tag(parent_run_id, "rlrun.best_params", json.dumps(res["best_params"])[:5000])
                client.set_tag(parent_run_id, "rlrun.best_value", str(res.get("best_value")))
                print(f"rlrun: best parameters {res['best_params']} (objective {res.get('best_value')})")
    failed = [f"{r.name} ({r.setting})" for r in summary.rows if r.status != "FINISHED"]
    all_failed = bool(summary.rows) and len(failed) == len(summary.rows)
    client.set_terminated(parent_run_id, "FAILED" if all_failed else "FINISHED")
    return {"text": text.getvalue(), "total": len(summary.rows), "failed": failed}


def end_parent_run(uri: str, parent_run_id: str, status: str) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).set_terminated(parent_run_id, status)


WRITER_CALLS: dict[str, Any] = {f.__name__: f for f in (create_parent_run, close_parent_run, end_parent_run)}


def log_curve(client: Any, run_id: str, points: list[tuple[float, float]], title: str,
               eval_points: list[tuple[float, float]], window: int = 100) -> None:
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], label=f"training (mean of the last {window} episodes)")
    if eval_points:
        ax.plot([p[0] for p in eval_points], [p[1] for p in eval_points], "o", label="greedy evaluation")
    ax.legend(loc="lower right")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "learning_curve.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        client.log_artifact(run_id, str(path))
