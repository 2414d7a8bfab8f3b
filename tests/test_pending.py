"""A detached run returns before its MLflow writer is done (``tracking.wait: false``); ``rlrun-wait``
waits for it, or writes the run from the record the trainer left if the writer was killed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, rlrun_cmd


def start_run(cwd: Path, *overrides: str) -> tuple[subprocess.Popen, Path]:
    """``rlrun`` with its output in a file, as at a terminal: nothing waits for the writer's end of
    a pipe. Returns the process and its output dir."""
    out_dir = cwd / f"run-{len(list(cwd.glob('run-*.log')))}"
    if not any(o.startswith("tracking.wait=") for o in overrides):  # these tests are about detached runs
        overrides = (*overrides, "tracking.wait=false")
    log = open(cwd / f"{out_dir.name}.log", "w")  # noqa: SIM115 - closed when the process has exited
    proc = subprocess.Popen(rlrun_cmd("+experiment=ppo_cartpole", f"output_dir={out_dir}", *overrides), cwd=cwd,
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    log.close()
    return proc, out_dir


def rlrun_wait(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlrun.tracking.pending", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})


def runs_of(cwd: Path, out_dir: Path) -> list:
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return [r for r in client.search_runs(exps) if r.data.tags.get("rlrun.output_dir") == str(out_dir)]


def writer_of(proc: subprocess.Popen) -> int | None:
    """The pid of the MLflow writer ``rlrun`` (``proc``) started, once it has (its child running the writer)."""
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != proc.pid:
                continue
            if b"rlrun.tracking.writer" in (d / "cmdline").read_bytes():
                return int(d.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def _has_run(db: Path, out_dir: Path) -> bool:
    """Whether the store holds the run of ``out_dir`` (its ``rlrun.output_dir`` tag), read with sqlite3
    directly: ~1 ms a look, so the writer runs nearly all the time between looks. Through MlflowClient a
    look took longer than the writer's 20 ms: under the suite's load these tests took 29-56 s (2026-11-26);
    7-8 s alone with this."""
    if not db.exists():
        return False
    try:  # timeout=0: the stopped writer may hold the store's write lock; then look again later
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0)) as con:
            return con.execute("select 1 from tags where key = 'rlrun.output_dir' and value = ? limit 1",
                               (str(out_dir),)).fetchone() is not None
    except sqlite3.Error:  # locked, or the schema is not there yet
        return False


def finished_with_its_writer_stopped(proc: subprocess.Popen, cwd: Path, out_dir: Path) -> int:
    """Stop (SIGSTOP) the writer of the detached run ``proc`` once it has created the MLflow run and
    before it has finished, then wait for ``rlrun`` to return; returns the stopped writer's pid. From
    its start the writer is stopped while we look and goes on for 20 ms between looks, so the run's
    creation cannot pass unseen however fast the rest is."""
    deadline = time.monotonic() + 300
    pid = None
    while time.monotonic() < deadline:
        pid = pid or writer_of(proc)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)
            if _has_run(cwd / "mlflow.db", out_dir):
                assert proc.wait(timeout=600) == 0
                assert (out_dir / "mlflow-pending.json").exists()
                return pid
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("the writer did not create the MLflow run within 300 s")


def assert_complete(cwd: Path, out_dir: Path, iterations: int) -> None:
    """Exactly one MLflow run for ``out_dir``: FINISHED, every iteration's metrics, curve and model."""
    (run,) = runs_of(cwd, out_dir)
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "timesteps_total")) == iterations
    assert run.data.tags["rlrun.stop_reason"] == f"training_iteration = {iterations} >= {iterations}"
    assert "learning_curve.png" in [a.path for a in client.list_artifacts(run.info.run_id)]
    models = client.search_logged_models([run.info.experiment_id])
    assert [m.source_run_id for m in models].count(run.info.run_id) >= 1
    assert not (out_dir / "mlflow-pending.json").exists()


@pytest.mark.slow
def test_rlrun_returns_first_and_rlrun_wait_waits_for_the_writer(tmp_path):
    proc, out_dir = start_run(tmp_path, "stop.training_iteration=2")
    assert proc.wait(timeout=600) == 0
    said = (tmp_path / "run-0.log").read_text()
    assert f"`rlrun-wait {out_dir}` waits for them" in said, said
    p = rlrun_wait(tmp_path)
    done = f"{out_dir.relative_to(tmp_path)}: MLflow run complete"
    assert p.returncode == 0 and done in p.stdout, p.stdout + p.stderr
    assert_complete(tmp_path, out_dir, 2)
    (run,) = runs_of(tmp_path, out_dir)  # which run, where, and how to browse it
    assert run.info.run_id in p.stdout or f"run '{run.info.run_name}'" in p.stdout, p.stdout
    assert f"in experiment 'ppo_cartpole' (mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db)" in p.stdout
    p = rlrun_wait(tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "rlrun-wait: nothing pending", p.stdout


@pytest.mark.slow
def test_a_killed_writer_loses_nothing(tmp_path):
    """SIGKILL to the writer right after rlrun returned: its record is replayed into the run."""
    proc, out_dir = start_run(tmp_path, "stop.training_iteration=3")
    pid = finished_with_its_writer_stopped(proc, tmp_path, out_dir)
    assert json.loads((out_dir / "mlflow-pending.json").read_text())["writer_pid"] == pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    p = rlrun_wait(tmp_path, str(out_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"the MLflow writer (pid {pid}) stopped before it finished; written from the record" in p.stdout, p.stdout
    assert_complete(tmp_path, out_dir, 3)


@pytest.mark.slow
def test_tracking_wait_true_returns_with_the_run_complete(tmp_path):
    proc, out_dir = start_run(tmp_path, "stop.training_iteration=1", "tracking.wait=true")
    assert proc.wait(timeout=600) == 0
    assert "finishing" not in (tmp_path / "run-0.log").read_text()
    assert_complete(tmp_path, out_dir, 1)


def test_rlrun_wait_refuses_what_it_cannot_read(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mlflow-pending.json").write_text('{"format": "something else"}')
    p = rlrun_wait(tmp_path)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"rlrun-wait: error: {Path('run/mlflow-pending.json')}: not a pending-run record rlrun wrote "
        "(format rlrun.mlflow-pending/1 expected)"), p.stderr
    p = rlrun_wait(tmp_path, "no/such/dir")
    assert p.returncode == 2 and p.stderr.strip() == "rlrun-wait: error: no/such/dir: no such file or directory"


@pytest.mark.slow
def test_a_resume_first_finishes_the_record_a_killed_writer_left(tmp_path):
    """resume= of a run whose writer died before it was done: the record is replayed before the
    resumed run starts, so the old writer's last word cannot land on the resumed run."""
    proc, out_dir = start_run(tmp_path, "stop.training_iteration=2", "tracking.log_model=false")
    assert proc.wait(timeout=600) == 0
    record = out_dir / "mlflow-pending.json"
    os.kill(json.loads(record.read_text())["writer_pid"], signal.SIGKILL)
    killed_first = record.exists()  # else the writer had finished a moment before the kill
    resume, resumed_dir = start_run(tmp_path, f"resume={out_dir}", "stop.training_iteration=3",
                                    "tracking.wait=true", "tracking.log_model=false")
    assert resume.wait(timeout=600) == 0, (tmp_path / "run-1.log").read_text()
    said = (tmp_path / "run-1.log").read_text()
    assert not record.exists() and not (resumed_dir / "mlflow-pending.json").exists()
    assert (f"rlrun: before resuming: {out_dir}: the MLflow writer" in said) == killed_first, said
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              order_by=["attributes.start_time DESC"])
    assert runs and all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "timesteps_total")]
    assert len(steps) == 3 and steps == sorted(steps), steps


@pytest.mark.slow
def test_a_checkpoint_that_names_its_run_only_by_run_key_still_finds_it(tmp_path):
    """A short run's checkpoint can be written before the writer has created the MLflow run: it names
    the run by its ``rlrun.run_key`` tag only. rlrun-eval (while the writer may still be finishing)
    logs into that run, and resume= continues it."""
    proc, out_dir = start_run(tmp_path, "stop.training_iteration=1", "tracking.log_model=false")
    assert proc.wait(timeout=600) == 0
    (ckpt,) = (out_dir / "checkpoints").glob("iter_*")
    meta = json.loads((ckpt / "meta.json").read_text())
    assert len(meta["rlrun_run_key"]) == 32, meta
    (ckpt / "meta.json").write_text(json.dumps({**meta, "mlflow_run_id": None}))  # written before the id came
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", f"checkpoint={ckpt}", "episodes=2"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    (run,) = runs_of(tmp_path, out_dir)
    assert run.data.tags["rlrun.run_key"] == meta["rlrun_run_key"]
    assert f"to MLflow run {run.info.run_id} under evaluation/{ckpt.name}/" in p.stdout, p.stdout
    resume, resumed_dir = start_run(tmp_path, f"resume={ckpt}", "stop.training_iteration=2", "tracking.wait=true",
                                    "tracking.log_model=false")
    assert resume.wait(timeout=600) == 0, (tmp_path / "run-1.log").read_text()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (only,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert only.info.run_id == run.info.run_id and only.info.status == "FINISHED"
    assert only.data.tags["rlrun.output_dir"] == str(resumed_dir)
    assert len(client.get_metric_history(run.info.run_id, "timesteps_total")) == 2


@pytest.mark.slow
def test_a_replay_without_the_run_id_finds_the_run_the_dead_writer_created(tmp_path):
    """A record written before the trainer learnt the MLflow run id: rlrun-wait's replay finds the
    run the killed writer had created by its run key instead of making a second one."""
    proc, out_dir = start_run(tmp_path, "stop.training_iteration=2")
    os.kill(finished_with_its_writer_stopped(proc, tmp_path, out_dir), signal.SIGKILL)
    record = out_dir / "mlflow-pending.json"
    data = json.loads(record.read_text())
    deadline = time.monotonic() + 60
    while Path(f"/proc/{data['writer_pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (created,) = runs_of(tmp_path, out_dir)
    record.write_text(json.dumps({**data, "run_id": None}))  # as if the id had come after the record
    p = rlrun_wait(tmp_path, str(out_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    (run,) = runs_of(tmp_path, out_dir)
    assert run.info.run_id == created.info.run_id and run.info.status == "FINISHED"
