"""Runs that are stopped, killed or started together lose nothing and mix nothing (through the real CLI,
each on its own MLflow SQLite store). ``experiments/faults/`` repeats these trials many times."""

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, rlrun_cmd

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
pytestmark = pytest.mark.slow  # real CLI runs of 10-40 s each
LONG = ["algo=ppo", "stop.timesteps_total=3000000", "checkpoint.every_n_iters=5", "progress=false"]


def _start(args, d, **kw):
    return subprocess.Popen(rlrun_cmd(*args), cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, **kw)


def _runs(d, experiment="Default"):
    client = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client, (list(client.search_runs([exp.experiment_id])) if exp else [])


def _wait_for_checkpoint(d, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not list(d.glob("outputs/*/*/checkpoints/iter_*/meta.json")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.1)


def _resume_one_iteration(d):
    # counters come back from the checkpoint, so training_iteration=1 is met after one more iteration
    # progress on: its summary names the run (progress=false prints nothing)
    p = subprocess.run(rlrun_cmd("algo=ppo", "stop.timesteps_total=null", "stop.training_iteration=1",
                                 "checkpoint.every_n_iters=5", "resume=latest"),
                       cwd=d, capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def _no_hole_in_history(d, covered):
    client, runs = _runs(d)
    assert [r.info.status for r in runs] == ["FINISHED"], "one run, continued and finished"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "timesteps_total")]
    assert steps == sorted(set(steps)), "no repeated or unordered steps"
    assert covered <= set(steps), f"{len(covered - set(steps))} checkpointed iterations missing"


def test_sigterm_is_ctrl_c_final_checkpoint_killed_run_and_resume_continues_it(tmp_path):
    proc = _start(LONG, tmp_path)
    _wait_for_checkpoint(tmp_path, proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)  # what systemd, Slurm and Kubernetes send: to the trainer only
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "final checkpoint" in err, err[-3000:]
    _, (run,) = _runs(tmp_path)
    assert run.info.status == "KILLED"
    newest = sorted(tmp_path.glob("outputs/*/*/checkpoints/iter_*/history.jsonl"))[-1]
    covered = {int(json.loads(line)["_step"]) for line in newest.read_text().splitlines()}
    resumed = _resume_one_iteration(tmp_path)
    _no_hole_in_history(tmp_path, covered)
    # the summary names the run it continued, not a new name for the same MLflow run
    assert f"MLflow     run '{run.info.run_name}' " in resumed.stdout, resumed.stdout[-2000:]


def test_group_sigkill_with_the_writer_leaves_nothing_running_and_resume_fills_the_history(tmp_path):
    proc = _start(LONG, tmp_path, start_new_session=True)
    _wait_for_checkpoint(tmp_path, proc)
    time.sleep(2.0)
    writers = [c for c in psutil.Process(proc.pid).children() if "rlrun.tracking.writer" in " ".join(c.cmdline())]
    assert writers
    os.killpg(proc.pid, signal.SIGKILL)  # a scheduler / the OOM killer: the whole process group ...
    for w in writers:
        w.kill()  # ... and the writer too, the worst case: nothing it had not written is confirmed
    proc.wait(timeout=30)
    psutil.wait_procs(writers, timeout=30)
    newest = sorted(tmp_path.glob("outputs/*/*/checkpoints/iter_*/history.jsonl"))[-1]
    covered = {int(json.loads(line)["_step"]) for line in newest.read_text().splitlines()}
    (newest.parents[1] / f".iter_999999.tmp-{proc.pid}-x1y2").mkdir()  # what a kill during a write leaves
    _resume_one_iteration(tmp_path)
    _no_hole_in_history(tmp_path, covered)
    assert not list(tmp_path.glob("outputs/*/*/checkpoints/.iter_*")), "a killed write's temp dir is cleaned"


@pytest.mark.parametrize("existing", [False, True], ids=["fresh_store", "existing_store"])
def test_three_runs_started_together_each_keep_their_own_config_and_checkpoint(tmp_path, existing):
    # a directory name of its own: MLflow caches one SQLite engine per URI in this process, and pytest
    # reuses a passed test's tmp_path name for the next parameter
    tmp_path = tmp_path / ("existing" if existing else "fresh")
    tmp_path.mkdir()
    base = ["+experiment=ppo_cartpole", "progress=false"]
    if existing:
        assert subprocess.run(rlrun_cmd(*base, "stop.timesteps_total=1000"), cwd=tmp_path, env=ENV,
                              capture_output=True, timeout=300).returncode == 0
    procs = {s: _start([*base, "stop.timesteps_total=5000", f"seed={s}"], tmp_path) for s in (10, 11, 12)}
    for s, p in procs.items():
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"seed {s}: {err[-3000:]}"
    client, runs = _runs(tmp_path, "ppo_cartpole")
    mine = {r.data.params["seed"]: r for r in runs if r.data.params["seed"] in ("10", "11", "12")}
    assert sorted(mine) == ["10", "11", "12"]
    for seed, r in mine.items():
        assert r.info.status == "FINISHED"
        stored = Path(r.info.artifact_uri.removeprefix("file://"))  # what MLflow keeps for this run
        assert f"seed: {seed}\n" in (stored / "config.yaml").read_text()
        (ckpt,) = [a.path for a in client.list_artifacts(r.info.run_id, "checkpoints")]
        meta = json.loads((stored / ckpt / "meta.json").read_text())
        assert meta["rlrun_run_key"] == r.data.tags["rlrun.run_key"], (meta, r.data.tags)
        assert meta["mlflow_run_id"] in (None, r.info.run_id)  # None: written before the writer created the run
    out_dirs = {r.data.tags["rlrun.output_dir"] for r in mine.values()}
    assert len(out_dirs) == 3
    # the store still answers a new run
    assert subprocess.run(rlrun_cmd(*base, "stop.timesteps_total=1000"), cwd=tmp_path, env=ENV,
                          capture_output=True, timeout=300).returncode == 0


def test_a_refused_resume_leaves_the_original_run_exactly_as_it_was(tmp_path):
    p = subprocess.run(rlrun_cmd("algo=ppo", "stop.training_iteration=2", "progress=false"), cwd=tmp_path,
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    _, (before,) = _runs(tmp_path)
    (ckpt,) = tmp_path.glob("outputs/*/*/checkpoints/iter_*")
    state = torch.load(ckpt / "policy.pt", weights_only=True)
    model = state["policies"]["default_policy"]["model"]
    model[next(iter(model))] = torch.zeros(3, 3)  # wrong shapes
    torch.save(state, ckpt / "policy.pt")
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        rows_before = db.execute("select count(*) from metrics").fetchone()[0]
    p = subprocess.run(rlrun_cmd("algo=ppo", "stop.training_iteration=4", "progress=false", f"resume={ckpt}"),
                       cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "does not fit" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    _, (after,) = _runs(tmp_path)
    assert after.info.status == before.info.status == "FINISHED"
    assert after.info.end_time == before.info.end_time
    assert after.data.tags == before.data.tags
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("select count(*) from metrics").fetchone()[0] == rows_before


def test_a_sac_run_killed_by_sigkill_resumes_its_mlflow_run_with_no_duplicate_steps(tmp_path):
    # small nets and a tiny learning rate: updates, replay and temperature run, the return stays far from the target
    sac = ["+experiment=sac_pendulum", "model.hiddens=[32,32]", "model.critic_hiddens=[32,32]", "algo.lr=1e-6",
           "checkpoint.every_n_iters=5", "checkpoint.include_replay=true"]
    proc = _start([*sac, "stop.timesteps_total=3000000", "progress=false"], tmp_path)
    _wait_for_checkpoint(tmp_path, proc)
    time.sleep(1.0)
    proc.kill()  # SIGKILL: no final checkpoint, no final status
    proc.wait(timeout=30)
    newest = sorted(tmp_path.glob("outputs/*/*/checkpoints/iter_*/history.jsonl"))[-1]
    covered = {int(json.loads(line)["_step"]) for line in newest.read_text().splitlines()}
    p = subprocess.run(rlrun_cmd(*sac, "stop.timesteps_total=null", "stop.training_iteration=1", "resume=latest"),
                       cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    client, runs = _runs(tmp_path, "sac_pendulum")
    assert [r.info.status for r in runs] == ["FINISHED"], "one run, continued and finished"
    run_id = runs[0].info.run_id
    assert f"run '{runs[0].info.run_name}'" in p.stdout, p.stdout[-2000:]
    for metric in ("timesteps_total", "rollout/episode_return_mean", "train/loss/critic", "train/alpha"):
        steps = [m.step for m in client.get_metric_history(run_id, metric)]
        assert steps and steps == sorted(set(steps)), f"{metric}: repeated or unordered steps"
    steps = {m.step for m in client.get_metric_history(run_id, "timesteps_total")}
    assert covered <= steps and max(steps) > max(covered), "the checkpointed iterations and the one after them"
