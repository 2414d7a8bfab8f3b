"""Sweeps through the real CLI: `rlrun -m ...` -> one MLflow parent run, one child per job, a summary
on the parent; failed jobs recorded without sinking the sweep; Ray launcher; Optuna; rlrun-report."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from rlrun.tracking.report import seed_curves, setting_of

from .conftest import REPO, ctrl_c_reaches_it, isolated, on_ray_cluster, run_cli

SUMMARY = {"multirun.yaml", "sweep_summary.csv", "sweep_summary.md", "sweep_returns.png"}


def _store(d):
    return MlflowClient(tracking_uri=f"sqlite:///{d / 'mlflow.db'}")


def _sweep_runs(client, experiment="ppo_cartpole"):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("rlrun.sweep") == "true"]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, sorted(children, key=lambda r: int(r.data.tags["rlrun.job_num"]))


@pytest.mark.slow
def test_multirun_makes_one_parent_and_a_child_per_job_with_the_summary(tmp_path):
    p = run_cli(["-m", "+experiment=ppo_cartpole", "seed=0,1", "algo.lr=1e-3,3e-4", "stop.timesteps_total=3000",
                 "progress=false"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    client = _store(tmp_path)
    parent, children = _sweep_runs(client)
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.algo.lr"] == "1e-3,3e-4" and parent.data.params["sweep.seed"] == "0,1"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= SUMMARY
    # the swept lr reaches the trainer (the preset's lr schedule starts at ${algo.lr})
    lrs = sorted(float(c.data.params["algo.lr"]) for c in children)
    assert lrs == [3e-4, 3e-4, 1e-3, 1e-3]
    assert {c.data.params["algo.lr_schedule"] for c in children} == {"[[0.0, 0.001], [150000.0, 0.0]]",
                                                                      "[[0.0, 0.0003], [150000.0, 0.0]]"}
    # every child has its console log; the summary names all four jobs
    assert "job.log" in {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert p.stdout.count("| FINISHED |") == 4 and "4 jobs, 4 finished, 0 failed" in p.stdout


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_others_finish(tmp_path):
    p = run_cli(["-m", "+experiment=ppo_cartpole", "algo.lr=-1,3e-4", "stop.timesteps_total=2000",
                 "progress=false"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]  # not all failed
    client = _store(tmp_path)
    parent, children = _sweep_runs(client)
    assert [c.info.status for c in children] == ["FAILED", "FINISHED"]
    assert children[0].data.tags["rlrun.error"] == "algo.lr: -1.0 must be positive"
    assert "job.log" in {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert parent.info.status == "FINISHED"
    assert "1 of 2 jobs failed: job 0 (algo.lr=-1)" in p.stderr
    assert "2 jobs, 1 finished, 1 failed: job 0 (`algo.lr=-1`)" in p.stdout


EXPLODING_ENV = """
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv
from rlrun import ENVS


class Explodes(CartPoleEnv):
    def step(self, action):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps > 300:  # passes the env check before training, fails inside the run
            raise RuntimeError("the simulator exploded")
        return super().step(action)


ENVS.add("explodes", Explodes, vector=False)
"""


@pytest.mark.slow
def test_a_job_failing_inside_the_run_keeps_its_run_and_error(tmp_path):
    (tmp_path / "explode_env.py").write_text(EXPLODING_ENV)
    p = run_cli(["-m", "+experiment=ppo_cartpole", "env.id=explodes", "plugins=[explode_env]", "seed=0,1",
                 "progress=false"], tmp_path)
    assert p.returncode == 1  # every job failed
    client = _store(tmp_path)
    _, children = _sweep_runs(client)
    assert [c.info.status for c in children] == ["FAILED", "FAILED"]
    for c in children:
        assert "the simulator exploded" in c.data.tags["rlrun.error"], c.data.tags["rlrun.error"]
        assert c.data.params["seed"] in ("0", "1")  # the run was started by run(): params are there
        assert {"config.yaml", "job.log"} <= {a.path for a in client.list_artifacts(c.info.run_id)}


@pytest.mark.slow
def test_sweep_exits_nonzero_only_when_every_job_failed(tmp_path):
    p = run_cli(["-m", "+experiment=ppo_cartpole", "algo.lr=-1,-2", "progress=false"], tmp_path)
    assert p.returncode == 1
    assert "2 of 2 jobs failed" in p.stderr
    parent, children = _sweep_runs(_store(tmp_path))
    assert parent.info.status == "FAILED" and [c.info.status for c in children] == ["FAILED", "FAILED"]


@pytest.mark.slow
def test_rlrun_report_regenerates_the_summary(tmp_path):
    p = run_cli(["-m", "+experiment=ppo_cartpole", "seed=0,1", "stop.timesteps_total=1000", "progress=false"],
                tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    sweep_dir = next(tmp_path.glob("multirun/*/*/rlrun_sweep.json")).parent
    (sweep_dir / "sweep_summary.md").unlink()
    env_py = [sys.executable, "-m", "rlrun.tracking.report"]
    r = subprocess.run([*env_py, str(sweep_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (sweep_dir / "sweep_summary.md").read_text().count("| FINISHED |") == 2
    parent_id = json.loads((sweep_dir / "rlrun_sweep.json").read_text())["parent_run_id"]
    r = subprocess.run([*env_py, parent_id], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "rlrun-report" / parent_id / "sweep_returns.png").is_file()
    bad = subprocess.run([*env_py, "nope"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and "nope: not a sweep directory" in bad.stderr


@pytest.mark.slow
def test_optuna_search_runs_its_trials_and_reports_the_best(tmp_path):
    p = run_cli(["-m", "+experiment=ppo_cartpole", "hparams_search=ppo_cartpole_optuna", "hydra.sweeper.n_trials=3",
                 "stop.timesteps_total=2000", "progress=false"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Best parameters" in p.stdout + p.stderr
    out = p.stdout + p.stderr  # quiet: no alembic plugin lines, no colour codes, floats to 4 digits
    assert "setup plugin" not in out and "\x1b[" not in out and "A new study created" not in out, out[:3000]
    jobs = [line for line in out.splitlines() if line.startswith(("rlrun: job", "[HYDRA] \t#"))]
    assert jobs and not any(re.search(r"=\d+\.\d{9,}", line) for line in jobs), jobs
    client = _store(tmp_path)
    parent, children = _sweep_runs(client)
    assert len(children) == 3
    best = json.loads(parent.data.tags["rlrun.best_params"])
    assert set(best) == {"algo.lr", "algo.gae_lambda", "algo.gamma", "loss.clip_param", "algo.num_sgd_iter",
                         "algo.train_batch_size"}
    assert "optimization_results.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id)}


def test_target_objectives_score_met_runs_by_steps_or_seconds_and_missed_runs_inf():
    from pathlib import Path

    from rlrun.app.cli import compose
    from rlrun.app.runner import RunResult
    from rlrun.core.sweep_info import objective_value

    metrics = {"timesteps_total": 70_000.0, "time_total_s": 41.5, "rollout/episode_return_mean": 480.0}
    met = RunResult(metrics, "rollout/episode_return_mean", True, Path("c"), Path("o"))
    missed = RunResult(metrics, "timesteps_total", False, Path("c"), Path("o"))
    assert objective_value("steps_to_target", met) == 70_000 and objective_value("time_to_target", met) == 41.5
    assert objective_value("time_to_target", missed) == float("inf") == objective_value("steps_to_target", missed)
    assert objective_value("rollout/episode_return_mean", missed) == 480
    assert compose(["+experiment=dqn_cartpole", "objective=time_to_target"]).objective == "time_to_target"


def test_setting_drops_seed_and_shared_overrides():
    common = {"stop.timesteps_total=5", "+experiment=ppo_cartpole"}
    assert setting_of("+experiment=ppo_cartpole seed=3 algo.lr=0.1 stop.timesteps_total=5", common) == "algo.lr=0.1"
    assert setting_of("seed=1", set()) == "(all jobs alike)"



def test_a_seed_that_stopped_early_holds_its_final_return_in_the_sweep_plot():
    import numpy as np

    fast = (np.array([1000.0, 2000.0]), np.array([300.0, 480.0]))  # met the target at 2,000 steps
    slow = (np.array([1000.0, 2000.0, 3000.0, 4000.0]), np.array([100.0, 200.0, 300.0, 476.0]))
    grid, ys = seed_curves([fast, slow])
    assert grid[0] == 1000 and grid[-1] == 4000
    assert ys[0, -1] == 480 and ys[1, -1] == 476 and ys.mean(axis=0)[-1] == 478  # not 476 / 2 + ... nor cut at 2,000


def test_a_ray_sweep_waits_for_its_warm_workers_only_where_jobs_may_start_rollout_actors():
    # the warm-up tasks hold the jobs' CPUs; a job's rollout actor could take one before the next job
    from omegaconf import OmegaConf

    from rlrun.app.sweep import _jobs_may_start_actors

    def sweep(num_workers: int, *task: str) -> bool:
        return _jobs_may_start_actors(OmegaConf.create({"rollout": {"num_workers": num_workers},
                                                        "hydra": {"overrides": {"task": list(task)}}}))

    assert sweep(1, "seed=0,1")  # rollout=ray composed in: every job has actors
    assert not sweep(0, "+experiment=ppo_cartpole", "seed=0,1", "algo.lr=1e-3,3e-4")
    assert sweep(0, "+experiment=ppo_cartpole,ppo_multi_cartpole", "seed=0,1")  # an experiment may choose ray
    assert sweep(0, "rollout=local,ray") and sweep(0, "rollout.num_workers=0,2")


@pytest.mark.ray
def test_ray_launcher_runs_jobs_in_parallel_with_rollout_actors_sharing_the_cpus(tmp_path):
    # 2 jobs at once on a 2-CPU Ray instance; each job holds 0.5 CPU and its one rollout actor 0.5.
    # 8,000 steps (~10 s a job): with 3,000 (~4 s) a loaded CI machine once started the second job's
    # process 0.6 s after the first had finished
    args = ["-m", "hydra/launcher=ray", "hydra.launcher.ray.init.num_cpus=2",
            "hydra.launcher.ray.remote.num_cpus=0.5", "+experiment=ppo_cartpole", "seed=0,1",
            "stop.timesteps_total=8000", "progress=false", "rollout=ray", "rollout.num_workers=1",
            "rollout.num_cpus_per_worker=0.5"]
    p = subprocess.run(isolated([sys.executable, "-m", "rlrun", *args]), cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr  # each job's lines in full, without Ray's folding or colour codes
    assert "[repeated" not in out and "\x1b[" not in out and "Started a local Ray" not in out, out[-3000:]
    assert out.count(": rollout/episode_return_mean = ") == 2, out[-3000:]
    _, children = _sweep_runs(_store(tmp_path))
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED"]
    starts = [c.info.start_time for c in children]
    ends = [c.info.end_time for c in children]
    assert max(starts) < min(ends), "the two jobs did not overlap"


@pytest.mark.ray
def test_ray_launcher_jobs_fail_clearly_when_actors_cannot_get_cpus(tmp_path):
    # Ray lends a task's CPU to others while the task waits in ray.wait, so whether 2 jobs x 2 one-CPU actors
    # on 2 CPUs deadlock depends on timing (CI once ran the jobs one after the other and both finished).
    # 4 one-CPU actors per job on 2 CPUs can never all start, whatever the timing.
    args = ["-m", "hydra/launcher=ray", "hydra.launcher.ray.init.num_cpus=2", "+experiment=ppo_cartpole",
            "seed=0,1", "stop.timesteps_total=2000", "progress=false", "rollout=ray", "rollout.num_workers=4",
            "rollout.ray.start_timeout_s=5"]
    p = subprocess.run(isolated([sys.executable, "-m", "rlrun", *args]), cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    _, children = _sweep_runs(_store(tmp_path))
    errors = [c.data.tags.get("rlrun.error", "") for c in children if c.info.status == "FAILED"]
    assert len(errors) == 2, p.stdout[-2000:]
    assert all("rollout workers started within rollout.ray.start_timeout_s=5" in e for e in errors), errors
    assert p.returncode == 1, "all jobs failed: the sweep must exit 1"


@pytest.mark.ray
def test_ray_launcher_joins_an_existing_cluster(tmp_path):
    # the plugin's fixed 75 MiB object store would make ray.init(address=auto) fail; our config drops it
    # -v: Ray's INFO line "Connecting to existing Ray cluster" is shown (held back without it)
    command = (f"{sys.executable} -m rlrun -v -m hydra/launcher=ray hydra.launcher.ray.init.address=auto "
               "'~hydra.launcher.ray.init._node_ip_address' +experiment=ppo_cartpole seed=0,1 "
               "stop.timesteps_total=2000 progress=false")
    p = subprocess.run(on_ray_cluster(command, 6392), cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert "Connecting to existing Ray cluster" in p.stderr + p.stdout
    _, children = _sweep_runs(_store(tmp_path))
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED"]


@pytest.mark.slow
def test_ctrl_c_marks_the_running_job_and_the_parent_killed(tmp_path):
    # a return no Pendulum run reaches: job 0 trains until the signal (it met the preset's -250 within the 6 s
    # below once, on a fast CPU, and finished before it)
    cmd = [sys.executable, "-m", "rlrun", "-m", "+experiment=ppo_pendulum", "seed=0,1", "progress=false",
           "++stop={rollout/episode_return_mean: 0}"]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("multirun/*/*/0/job.log")) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(6)  # job 0 is training now
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    client = _store(tmp_path)
    exp = client.get_experiment_by_name("ppo_pendulum")
    runs = {r.data.tags.get("rlrun.job_num", "parent"): r.info.status for r in client.search_runs([exp.experiment_id])}
    assert runs == {"parent": "KILLED", "0": "KILLED"}, runs
