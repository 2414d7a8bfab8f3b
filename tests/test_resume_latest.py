"""``resume=latest`` and ``rlrun-eval checkpoint=latest``: the newest checkpoint of a single run of the
same experiment and seed (a sweep job: of its own job), said on the console before anything trains."""

import re
import subprocess
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from rlrun.core.errors import CheckpointError
from rlrun.training.checkpoint import check_resumable, find_latest_checkpoint, job_keys
from tests.conftest import REPO, run_cli, run_summary

PPO = ["+experiment=ppo_cartpole", "stop.training_iteration=2", "progress=true", "tracking.wait=true"]


def _resuming(stdout: str) -> str:
    """The checkpoint a run said it resumed."""
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("rlrun: resuming ")]
    return line[len("rlrun: resuming "):].split(": iteration")[0]


def _job_seed(checkpoint: str) -> int:
    with open(f"{checkpoint}/config.yaml") as f:
        return yaml.safe_load(f)["seed"]


@pytest.mark.slow
def test_latest_is_the_single_run_of_the_same_experiment_and_seed_never_a_sweep_job(tmp_path):
    single = run_cli(PPO, tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    s = run_summary(single.stdout)
    sweep = run_cli(["-m", *PPO, "seed=1,2"], tmp_path)  # newer checkpoints, other seeds
    assert sweep.returncode == 0, sweep.stderr[-2000:]

    again = run_cli([*PPO, "stop.training_iteration=3", "resume=latest"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    taken = _resuming(again.stdout)
    assert taken == s["checkpoint"]  # named before training: the single run's last checkpoint
    t = run_summary(again.stdout)
    assert t["run_id"] == s["run_id"] and t["resumed"].startswith(f"{taken}: iteration 2, ")
    assert f"MLflow run '{s['run_name']}'" in t["resumed"]  # its id too once the checkpoint has it
    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(s["run_id"])
    assert run.data.params["seed"] == run.data.tags["rlrun.seed"] == "0"  # one seed

    other = run_cli(["+experiment=dqn_cartpole", "resume=latest"], tmp_path)
    assert other.returncode == 2
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "resume=latest: no checkpoint of experiment 'dqn_cartpole'" in lines[0], lines
    assert str(tmp_path / "outputs") in lines[0]

    seed = run_cli([*PPO, "seed=2", "resume=latest"], tmp_path)  # seed 2 ran only as a sweep job
    assert seed.returncode == 2 and "its runs there have seed 0 (add seed=0)" in seed.stderr, seed.stderr


@pytest.mark.slow
def test_a_sweep_with_resume_latest_continues_each_job_from_its_own_checkpoint(tmp_path):
    first = run_cli(["-m", *PPO, "seed=1,2"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    single = run_cli([*PPO, "seed=1"], tmp_path)  # a newer single run of seed 1: not a job's checkpoint
    assert single.returncode == 0, single.stderr[-2000:]
    again = run_cli(["-m", *PPO, "stop.training_iteration=3", "seed=1,2", "resume=latest"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    taken = re.findall(r"^rlrun: resuming (\S+): iteration 2, ", again.stdout, re.M)
    assert len(taken) == 2 and all("/multirun/" in t for t in taken), again.stdout[-3000:]
    assert sorted(_job_seed(t) for t in taken) == [1, 2]  # each job its own seed's checkpoint


def test_a_resume_keeps_its_checkpoints_seed(tmp_path):
    old = {"seed": 1, "algo": {"name": "ppo", "lr": 1e-3}}
    assert check_resumable(old, {"seed": 1, "algo": {"name": "ppo", "lr": 3e-4}}, tmp_path) == {
        "algo.lr": (1e-3, 3e-4)}
    with pytest.raises(CheckpointError, match=r"seed: 1 in the checkpoint, 0 now \(.*add seed=1\)"):
        check_resumable(old, {"seed": 0, "algo": {"name": "ppo", "lr": 1e-3}}, tmp_path)


def test_a_null_action_dist_is_the_distribution_it_resolves_to_when_a_resume_compares_configs(tmp_path):
    import gymnasium as gym

    from rlrun.app.resume import with_resolved_dist
    from rlrun.sources.plugins import load_builtins

    load_builtins()
    box, two = gym.spaces.Box(-2.0, 2.0, (1,)), gym.spaces.Discrete(2)
    # twin_q_mlp's checkpoints named squashed_gaussian before null meant it on a Box
    old = {"seed": 0, "model": {"name": "twin_q_mlp", "action_dist": "squashed_gaussian"}}
    new = {"seed": 0, "model": {"name": "twin_q_mlp", "action_dist": None}}
    assert check_resumable(with_resolved_dist(old, [box]), with_resolved_dist(new, [box, box]), tmp_path) == {}
    assert with_resolved_dist(new, [two])["model"]["action_dist"] == "categorical"
    assert with_resolved_dist(new, [box, two])["model"]["action_dist"] is None  # policies that resolve it apart
    mlp = {"seed": 0, "model": {"name": "mlp", "action_dist": None}}  # null: the mlp's diag_gaussian on a Box
    with pytest.raises(CheckpointError, match="model.action_dist: 'diag_gaussian' in the checkpoint, "
                                              "'squashed_gaussian' now"):
        check_resumable(with_resolved_dist(mlp, [box]), with_resolved_dist(
            {"seed": 0, "model": {"name": "mlp", "action_dist": "squashed_gaussian"}}, [box]), tmp_path)


def test_a_sac_run_checkpointed_with_its_action_dist_named_resumes_where_it_is_null_now(tmp_path):
    base = ["+experiment=sac_pendulum", "tracking=none", "progress=false", "model.hiddens=[16,16]",
            "model.critic_hiddens=[16,16]", "evaluation.interval=0"]
    first = run_cli([*base, "stop.training_iteration=2", "model.action_dist=squashed_gaussian",
                     f"output_dir={tmp_path / 'first'}"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli([*base, "stop.training_iteration=3", f"resume={tmp_path / 'first'}"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "rlrun: resuming " in again.stdout and ": iteration 2, " in again.stdout


def test_a_sweep_jobs_identity_is_what_its_overrides_set_besides_stop_and_bookkeeping():
    assert job_keys(["+experiment=ppo_cartpole", "seed=1", "algo.lr=0.001", "stop.training_iteration=3",
                     "resume=latest", "progress=true", "++tracking.wait=true", "~env.kwargs"]) == \
        ["seed", "algo.lr", "env.kwargs"]


def _fake_checkpoint(root, run, experiment, seed, mtime):
    import os

    cp = root / run / "checkpoints" / "iter_000001"
    cp.mkdir(parents=True)
    (cp / "config.yaml").write_text(yaml.safe_dump({"experiment": experiment, "seed": seed,
                                                    "algo": {"name": "ppo"}, "env": {"id": "CartPole-v1"}}))
    (cp / "meta.json").write_text("{}")
    os.utime(cp / "meta.json", (mtime, mtime))
    return cp


def test_eval_latest_takes_single_runs_only_and_an_experiment_narrows_it(tmp_path):
    a = _fake_checkpoint(tmp_path / "outputs", "a", "ppo_cartpole", 0, 1000)
    b = _fake_checkpoint(tmp_path / "outputs", "b", "ppo_other", 0, 2000)
    _fake_checkpoint(tmp_path / "multirun", "s/0", "ppo_cartpole", 0, 3000)  # newest, a sweep job's
    assert find_latest_checkpoint(tmp_path, None, key="checkpoint") == b
    assert find_latest_checkpoint(tmp_path, None, key="checkpoint", experiment="ppo_cartpole") == a
    with pytest.raises(CheckpointError, match="checkpoint=latest: no checkpoint of experiment 'nope'"):
        find_latest_checkpoint(tmp_path, None, key="checkpoint", experiment="nope")


@pytest.mark.slow
def test_rlrun_eval_latest_says_which_checkpoint_it_took(tmp_path):
    single = run_cli([*PPO, "tracking=none"], tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    s = run_summary(single.stdout)
    p = subprocess.run([sys.executable, "-m", "rlrun.app.eval_cli", "checkpoint=latest", "experiment=ppo_cartpole",
                        "episodes=2"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"rlrun-eval: latest: {s['checkpoint']}: iteration 2, " in p.stdout
