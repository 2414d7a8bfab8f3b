import itertools
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from rlrun.app.runner import stop_reason
from tests.conftest import REPO, ctrl_c_reaches_it, rlrun_cmd, run_cli, run_summary


def test_stop_reason_any_criterion_and_nan_never_meets():
    stop = {"timesteps_total": 100, "rollout/episode_return_mean": 10}
    assert stop_reason(stop, {"timesteps_total": 50, "rollout/episode_return_mean": float("nan")}) is None
    assert stop_reason(stop, {"timesteps_total": 100}) == "timesteps_total = 100 >= 100"
    assert "rollout/episode_return_mean" in stop_reason(stop, {"timesteps_total": 1, "rollout/episode_return_mean": 11})


DENORMALS_AFTER = """
import sys, numpy as np, torch
if sys.argv[1] == "run":
    from rlrun.app.cli import exit_status
    sys.argv = ["rlrun", "+experiment=ppo_cartpole", "torch_threads=2", "stop.training_iteration=1", "tracking=none",
                "progress=false", "output_dir=" + sys.argv[2]]
    assert exit_status() == 0
torch.set_num_threads(2)
y = torch.from_numpy(np.full(4_000_000, 1e-39, np.float32)) * 1.0  # split between the two threads
print(np.count_nonzero(y.numpy()))
"""


@pytest.mark.parametrize("run", [True, False])
def test_a_run_flushes_denormals_to_zero_in_all_of_torchs_threads(tmp_path, run):
    """After a run on two torch threads, a denormal float times 1 is 0 in both threads' halves of a
    4M-row product (its thread pool was started after the flush); without a run it stays a denormal."""
    p = subprocess.run([sys.executable, "-c", DENORMALS_AFTER, "run" if run else "plain", str(tmp_path / "out")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stdout.split()[-1]) == (0 if run else 4_000_000)


def test_matmul_precision_is_set_per_run_and_never_carries_over(tmp_path):
    import torch

    from rlrun import make_trainer

    base = ["+experiment=ppo_cartpole", "tracking=none", f"output_dir={tmp_path / 'out'}"]
    try:
        make_trainer([*base, "torch_matmul_precision=medium"], tmp_path)
        assert torch.get_float32_matmul_precision() == "medium"
        assert torch.backends.mkldnn.conv.fp32_precision == "bf16"  # convolutions follow it
        make_trainer(base, tmp_path)  # the default: float32 matmuls and convolutions in float32 again
        assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.mkldnn.conv.fp32_precision == "none"
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.backends.mkldnn.conv.fp32_precision = "none"


def test_torch_threads_stay_within_omp_num_threads_and_the_run_records_the_count_it_ran_with(tmp_path, monkeypatch,
                                                                                             capsys):
    """OMP_NUM_THREADS (a batch scheduler's, or Ray's in a launcher job or a Tune trial) caps a preset's
    torch_threads; a larger, unset or unreadable one leaves it; a real run's config.yaml has the count."""
    import torch

    from rlrun import make_trainer

    base = ["+experiment=dqn_cartpole", "tracking=none", f"output_dir={tmp_path / 'out'}"]  # torch_threads: 2
    before = torch.get_num_threads()
    try:
        for value, threads in (("1", 1), ("1,1", 1), ("4", 2), ("", 2), ("auto", 2), ("0", 2)):
            monkeypatch.setenv("OMP_NUM_THREADS", value)
            trainer = make_trainer(base, tmp_path)
            assert (trainer.cfg.torch_threads, torch.get_num_threads()) == (threads, threads), value
            said = capsys.readouterr().out
            assert ("rlrun: torch_threads 2 -> 1, as OMP_NUM_THREADS=1" in said) == (threads == 1), (value, said)
    finally:
        torch.set_num_threads(before)
    p = run_cli(["+experiment=dqn_cartpole", "stop.training_iteration=1", "tracking=none", "progress=false",
                 f"output_dir={tmp_path / 'run'}"], tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "torch_threads 2 -> 1" in p.stdout
    assert "torch_threads: 1\n" in (tmp_path / "run" / "config.yaml").read_text()


@pytest.mark.slow
def test_ctrl_c_writes_a_final_checkpoint_and_marks_the_run_killed(tmp_path):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(rlrun_cmd("+experiment=ppo_cartpole", "stop.timesteps_total=10000000",
                                      "++stop={rollout/episode_return_mean: 1000}"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "iter" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        time.sleep(2.0)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ppo_cartpole").experiment_id])
    assert run.info.status == "KILLED"
    (ckpt,) = client.list_artifacts(run.info.run_id, "checkpoints")
    assert ckpt.path.startswith("checkpoints/iter_")


@pytest.mark.slow
def test_sigkill_then_resume_latest_reaches_475_with_one_continuous_history(tmp_path):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["+experiment=ppo_cartpole", "checkpoint.every_n_iters=5"]
    proc = subprocess.Popen(rlrun_cmd(*args), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("outputs/**/checkpoints/iter_*/meta.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a few iterations past the first checkpoint, maybe mid-way through another
        tracking_child = psutil.Process(proc.pid).children()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the tracking child notices the dead trainer, marks the run KILLED and exits; only then read the
    # store (a second client during its first-time schema creation would race the migrations)
    _, alive = psutil.wait_procs(tracking_child, timeout=60)
    assert not alive
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ppo_cartpole")
    (killed,) = client.search_runs([exp.experiment_id])
    assert killed.info.status == "KILLED"
    steps_before = [m.step for m in client.get_metric_history(killed.info.run_id, "timesteps_total")]

    p = subprocess.run(rlrun_cmd(*args, "resume=latest"), cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert run_summary(p.stdout)["stopped"].startswith("rollout/episode_return_mean")
    (run,) = client.search_runs([exp.experiment_id])  # the same run, continued
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "timesteps_total")]
    assert steps[: len(steps_before)] == steps_before and len(steps) > len(steps_before)
    assert steps == sorted(set(steps))  # no duplicate steps
    # no gap: at most one iteration (1024 rows, plus fewer than 32) apart
    assert max(b - a for a, b in itertools.pairwise(steps)) < 2 * 1024
    assert run.data.metrics["rollout/episode_return_mean"] >= 475
    assert run.data.metrics["timesteps_total"] <= 150_000 + 600


@pytest.mark.slow
def test_the_last_lines_say_where_the_results_are_and_the_mlflow_run_is_named_and_timed(tmp_path):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # tracking.wait=true: the summary comes once the run is complete, so it always has the run's address
    # (with the default, a run this short can end before the writer has created the MLflow run)
    p = subprocess.run(rlrun_cmd("+experiment=ppo_cartpole", "seed=4", "stop.timesteps_total=3000",
                                 "evaluation.interval=2", "tracking.wait=true"), cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "eval at " in p.stdout and "(greedy, 10 episodes)" in p.stdout  # evaluation results on the console
    assert p.stderr.strip() == "", p.stderr  # nothing from MLflow's store creation glued into the output
    s = run_summary(p.stdout)
    assert re.fullmatch(r"timesteps_total = \d+ >= 3000", s["stopped"]) and int(s["steps"]) >= 3000
    assert (tmp_path / "outputs").resolve() in Path(s["output"]).parents and Path(s["checkpoint"]).is_dir()
    assert s["browse"] == f"mlflow ui --backend-store-uri sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    exp_id = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment_by_name("ppo_cartpole")
    assert s["open"] == (f"http://127.0.0.1:5000/#/experiments/{exp_id.experiment_id}/runs/{s['run_id']}"
                         "?workflowType=machine_learning")
    iteration_lines = [ln for ln in p.stdout.splitlines() if ln.startswith("iter ")]
    assert len(iteration_lines) == len(set(iteration_lines))  # the last iteration is not printed twice

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ppo_cartpole")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the model-training view
    run = client.get_run(s["run_id"])
    assert run.info.run_name == s["run_name"] and re.fullmatch(r"ppo_cartpole-s4-[0-9a-f]{4}", s["run_name"])
    assert not {"output_dir", "progress", "torch_threads"} & set(run.data.params)
    assert run.data.params["torch_matmul_precision"] == "highest"  # it changes the numbers: a param, not a tag
    assert "train/loss/kl" not in run.data.metrics and "train/loss/policy" in run.data.metrics  # no flat-zero charts
    assert run.data.tags["rlrun.output_dir"] == s["output"]
    # the checkpoint is on disk once: MLflow's local artifact store holds hard links to the run dir's files
    local = Path(s["checkpoint"]) / "policy.pt"
    stored = tmp_path / "mlartifacts" / run.info.run_id / "artifacts" / "checkpoints" / local.parent.name / "policy.pt"
    assert stored.stat().st_ino == local.stat().st_ino and local.stat().st_nlink == 2
    assert f"checkpoints/{local.parent.name}/policy.pt" in {
        a.path for a in client.list_artifacts(run.info.run_id, f"checkpoints/{local.parent.name}")}
    first = min(m.timestamp for m in client.get_metric_history(run.info.run_id, "timesteps_total"))
    assert run.info.start_time <= first  # the run's duration covers its training



def test_the_training_return_is_over_metrics_num_episodes_for_smoothing_episodes():
    from rlrun import make_trainer

    results = {}
    for window in (1, 100):
        t = make_trainer(["+experiment=ppo_cartpole", "tracking=none", f"metrics_num_episodes_for_smoothing={window}"])
        results[window] = t.train()
        t.stop()
    one, hundred = results[1], results[100]
    assert one["rollout/episode_return_min"] == one["rollout/episode_return_mean"] == one["rollout/episode_return_max"]
    assert hundred["rollout/episode_return_min"] < hundred["rollout/episode_return_max"]  # same episodes, many of them
    assert one["rollout/episodes_this_iter"] == hundred["rollout/episodes_this_iter"] > 1


def test_an_iteration_of_many_rounds_is_those_rounds_as_iterations():
    """min_sample_timesteps_per_iteration=8 with 1-row rounds (one SAC update per env step): one iteration
    ends where eight 1-step iterations end, bit for bit, and reports the eight rounds as one."""
    import numpy as np
    import torch

    from rlrun import make_trainer

    base = ["+experiment=sac_pendulum", "tracking=none", "algo.train_batch_size=1", "rollout.rollout_fragment_length=1",
            "algo.learning_starts=3", "evaluation.interval=0"]
    one = make_trainer([*base, "min_sample_timesteps_per_iteration=8"])
    many = make_trainer(base)
    try:
        got = one.train()
        steps = [many.train() for _ in range(8)]
        assert got["training_iteration"] == 1 and steps[-1]["training_iteration"] == 8
        assert got["timesteps_total"] == got["rollout/env_steps_this_iter"] == steps[-1]["timesteps_total"] == 8
        for a, b in zip(one.policy.model.state_dict().values(), many.policy.model.state_dict().values(), strict=True):
            assert torch.equal(a, b)
        updated = [s for s in steps if "train/loss/critic" in s]
        assert len(updated) == 6  # rows 3..8 are stored with at least learning_starts rows: one update each
        assert got["train/num_sgd_steps"] == 6 and got["train/num_updates"] == steps[-1]["train/num_updates"] == 6
        assert got["train/replay_size"] == 8
        assert got["train/loss/critic"] == pytest.approx(np.mean([s["train/loss/critic"] for s in updated]))
        assert got["time/iteration_s"] >= got["time/sample_s"] + got["time/learn_s"]
    finally:
        one.stop()
        many.stop()


def test_min_time_s_per_iteration_holds_an_iteration_open_for_that_long_as_rounds():
    """min_time_s_per_iteration (RLlib's key) repeats 1-step rounds until the iteration has run that long, and
    with min_sample_timesteps_per_iteration until both minimums are met; 0 and 0 are one round."""
    from rlrun import make_trainer

    base = ["+experiment=sac_pendulum", "tracking=none", "algo.train_batch_size=1", "rollout.rollout_fragment_length=1",
            "algo.learning_starts=100000", "evaluation.interval=0", "checkpoint.every_n_iters=0"]
    timed = make_trainer([*base, "min_time_s_per_iteration=0.3"])
    both = make_trainer([*base, "min_time_s_per_iteration=0.01", "min_sample_timesteps_per_iteration=5000"])
    once = make_trainer(base)
    try:
        first, second = timed.train(), timed.train()
        for r in (first, second):
            assert r["time/iteration_s"] >= 0.3 and r["rollout/env_steps_this_iter"] > 10  # many 1-step rounds
        assert second["timesteps_total"] == first["rollout/env_steps_this_iter"] + second["rollout/env_steps_this_iter"]
        assert both.train()["rollout/env_steps_this_iter"] == 5000  # the steps' minimum outlasts 10 ms
        assert once.train()["rollout/env_steps_this_iter"] == 1
    finally:
        for tr in (timed, both, once):
            tr.stop()
@pytest.mark.parametrize(("overrides", "want"), [
    (["+experiment=sac_pendulum"], {"rlrun.action_dist": "squashed_gaussian"}),  # twin_q_mlp's own on a Box
    (["+experiment=td3_pendulum"], {"rlrun.action_dist": "deterministic"}),  # set in the preset
    (["+experiment=ppo_pendulum"], {"rlrun.action_dist": "diag_gaussian"}),  # the mlp's: no default of its own
    (["+experiment=sac_minigrid_empty"], {"rlrun.action_dist": "categorical"}),
    # per policy; the heuristic always_same has none
    (["+experiment=ppo_rps"], {"rlrun.action_dist.learned": "categorical"}),
    (["+experiment=ppo_multi_cartpole"],
     {"rlrun.action_dist.p0": "categorical", "rlrun.action_dist.p1": "categorical"}),
])
def test_the_run_is_tagged_with_the_action_distribution_its_null_model_action_dist_resolves_to(overrides, want):
    from rlrun.app.cli import compose
    from rlrun.app.run_record import action_dist_tags
    from rlrun.policy.policy_map import run_spaces

    cfg = compose(["tracking=none", *overrides])
    assert action_dist_tags(cfg, run_spaces(cfg)) == want


def test_the_replay_check_sizes_rows_with_the_envs_spaces_and_sums_every_policys_buffer(monkeypatch):
    from rlrun.app.cli import compose
    from rlrun.config import resources
    from rlrun.config.typed import ConfigError
    from rlrun.policy.policy_map import run_spaces

    from .test_multi_agent import MA_CARTPOLE

    cfg = compose([*MA_CARTPOLE, "algo=dqn", "algo.replay_capacity=1000"])
    single = compose(["+experiment=dqn_cartpole", "algo.replay_capacity=100000", "tracking=none"])
    row = 2 * 4 * 4 + 8 + 8  # two 4-float observations, an int64 action, reward and discount
    monkeypatch.setattr(resources, "machine_memory", lambda: int(2 * 1000 * row / resources.FRACTION))
    resources.check_replay_memory(cfg, run_spaces(cfg))  # two buffers of 1,000 rows fit exactly
    monkeypatch.setattr(resources, "machine_memory", lambda: int(2 * 1000 * row / resources.FRACTION) - 10)
    with pytest.raises(ConfigError, match=r"^multiagent.policies.p\d.algo.replay_capacity: 1,000 rows of 4 float32 "
                                          r"observations \(each row holds two\)"):
        resources.check_replay_memory(cfg, run_spaces(cfg))
    monkeypatch.setattr(resources, "machine_memory", lambda: 10**6)  # a single-agent run: its own key
    with pytest.raises(ConfigError, match=r"^algo.replay_capacity: 100,000 rows of 4 float32"):
        resources.check_replay_memory(single, run_spaces(single))
