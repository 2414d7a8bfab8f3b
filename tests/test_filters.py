"""rollout.observation_filter=mean_std: exact running statistics, the learner/worker sync (Ray
workers included), checkpoints and resume, frozen evaluation, and the exported MLflow model taking
raw observations."""

import subprocess
import sys
import textwrap

import mlflow
import numpy as np
import pytest
import torch

from rlrun.app.cli import compose
from rlrun.app.runner import run
from rlrun.envs.filters import MeanStdFilter, RunningStat
from rlrun.training.export import load_policy
from rlrun.training.trainer import Trainer
from tests.conftest import REPO, isolated


def test_running_stats_merge_exactly_like_one_pass_over_all_data():
    rng = np.random.default_rng(0)
    parts = [rng.normal(3.0, 2.0, (n, 3)) for n in (1, 7, 50, 2)]
    a, b = RunningStat((3,)), RunningStat((3,))
    for p in parts[:2]:
        a.push_batch(p)
    for p in parts[2:]:
        b.push_batch(p)
    a.merge(b.n, b.mean, b.m2)
    allx = np.concatenate(parts)
    assert a.n == len(allx)
    np.testing.assert_allclose(a.mean, allx.mean(0))
    np.testing.assert_allclose(a.std, allx.std(0))


def test_worker_and_learner_copies_agree_after_a_sync():
    rng = np.random.default_rng(1)
    learner, w1, w2 = (MeanStdFilter((2,), clip=5.0) for _ in range(3))
    seen = []
    for _ in range(3):  # three iterations: workers see data, report deltas, take the merged statistics
        for w in (w1, w2):
            x = rng.normal(1.0, 4.0, (16, 2))
            seen.append(x)
            w(x, update=True)
        for w in (w1, w2):
            learner.apply_delta(w.pop_delta())
        state = learner.get_state()
        for w in (w1, w2):
            w.sync(state)
    allx = np.concatenate(seen)
    for f in (learner, w1, w2):
        assert f.rs.n == len(allx)
        np.testing.assert_allclose(f.rs.mean, allx.mean(0))
    x = rng.normal(0, 100, (4, 2))
    np.testing.assert_array_equal(w1(x), learner(x))  # frozen use: identical outputs
    assert np.abs(learner(x)).max() <= 5.0  # clipped
    # a worker keeps what it saw after its report when the learner's statistics arrive
    w1(np.ones((10, 2)), update=True)
    w1.sync(learner.get_state())
    assert w1.rs.n == learner.rs.n + 10
    w1.set_state(learner.get_state())  # a checkpoint restore: exactly the saved statistics
    assert w1.rs.n == learner.rs.n and w1.pop_delta() is None


def _cfg(tmp_path, *extra, tracking="none", out="out"):
    return compose(["+experiment=ppo_cartpole", "rollout.observation_filter=mean_std", f"tracking={tracking}",
                    "progress=false", f"output_dir={tmp_path / out}", *extra])


def _filter_state(checkpoint_dir):
    return torch.load(checkpoint_dir / "policy.pt", weights_only=True)["policies"]["default_policy"]["obs_filter"]


def test_the_filter_is_checkpointed_and_a_resumed_run_continues_with_its_statistics(tmp_path):
    first = run(_cfg(tmp_path, "stop.training_iteration=2", "stop.timesteps_total=null"), launch_dir=tmp_path)
    saved = _filter_state(first.checkpoint_dir)
    steps = first.metrics["timesteps_total"]
    assert saved["n"] >= steps and saved["clip"] == 10.0  # every observation seen (plus the reset ones)
    trainer = Trainer(_cfg(tmp_path), tmp_path)
    try:
        n_envs = trainer.workers.local_worker.num_envs
        assert trainer.policy.obs_filter.rs.n == n_envs  # a fresh trainer: only the first reset observations
        trainer.set_state(torch.load(first.checkpoint_dir / "policy.pt", weights_only=True))
        # the saved statistics, and the first observations of the resumed envs (started afresh: a seed of their own)
        assert trainer.policy.obs_filter.rs.n == int(saved["n"]) + n_envs
        np.testing.assert_allclose(trainer.policy.obs_filter.rs.mean, saved["mean"].numpy(), atol=2e-3)
        assert not np.array_equal(trainer.policy.obs_filter.rs.mean, saved["mean"].numpy())
    finally:
        trainer.stop()
    resumed = run(_cfg(tmp_path, "stop.training_iteration=3", "stop.timesteps_total=null",
                       f"resume={first.checkpoint_dir}", out="resumed"), launch_dir=tmp_path)
    after = _filter_state(resumed.checkpoint_dir)
    new_steps = resumed.metrics["timesteps_total"] - steps
    # continued from the saved statistics: the new iteration's observations (and one reset) on top
    assert saved["n"] + new_steps <= after["n"] <= saved["n"] + new_steps + 2 * n_envs


def test_the_exported_model_takes_raw_observations_and_acts_like_the_policy(tmp_path):
    r = run(_cfg(tmp_path, "stop.training_iteration=3", "stop.timesteps_total=null", tracking="mlflow"),
            launch_dir=tmp_path)
    loaded = load_policy(r.checkpoint_dir, tmp_path)
    f = loaded.policy.obs_filter
    assert f.active and f.rs.n > 1000
    raw = np.random.default_rng(0).normal(0, [1.0, 2.0, 0.1, 2.0], (64, 4)).astype(np.float32)
    expected = loaded.policy.compute_actions(loaded.policy.filter_obs(raw), explore=False).actions
    unfiltered = loaded.policy.compute_actions(raw, explore=False).actions
    assert (expected != unfiltered).any()  # the filter matters for these observations
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(f"runs:/{r.run_id}/model", dst_path=str(tmp_path / "downloaded"))
    np.testing.assert_array_equal(np.asarray(model.predict(raw)).reshape(-1), expected)
    assert f.rs.n == _filter_state(r.checkpoint_dir)["n"]  # loading and predicting froze the statistics


@pytest.mark.ray
def test_filter_state_is_identical_on_every_ray_worker_after_a_sync_and_lstm_ppo_trains_there(tmp_path):
    # the LSTM preset has the mean_std filter: one Ray instance checks both
    code = textwrap.dedent("""
        import numpy as np, ray
        from rlrun import make_trainer
        t = make_trainer(["+experiment=ppo_lstm_stateless_cartpole", "rollout=ray", "rollout.num_workers=2",
                          "tracking=none"])
        for _ in range(3):
            r = t.train()
        # 10 epochs of at least 4 minibatches: 1024-row batches in sequences of 256 rows
        assert r["train/num_sgd_steps"] >= 40 and np.isfinite(r["train/loss/total"]), r
        learner = t.policy.obs_filter.rs
        states = ray.get([w.get_filters.remote() for w in t.workers._remote.values()])
        for s in states:
            f = s["default_policy"]
            assert f["n"] == learner.n, (f["n"], learner.n)
            assert np.array_equal(f["mean"].numpy(), learner.mean) and np.array_equal(f["m2"].numpy(), learner.m2)
        print("workers", len(states), "n", learner.n, "steps", t.timesteps_total)
        t.stop()
    """)
    env = {"PYTHONPATH": str(REPO)}
    import os
    p = subprocess.run(isolated([sys.executable, "-c", code]), cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    workers, n, steps = p.stdout.split()[1::2]
    assert workers == "2" and float(n) >= float(steps), p.stdout


def test_each_policy_of_a_multi_agent_run_has_its_own_filter(tmp_path):
    cfg = compose(["+experiment=ppo_multi_cartpole", "rollout.observation_filter=mean_std", "tracking=none",
                   "progress=false", f"output_dir={tmp_path / 'out'}", "stop.training_iteration=2"])
    r = run(cfg, launch_dir=tmp_path)
    policies = torch.load(r.checkpoint_dir / "policy.pt", weights_only=True)["policies"]
    n = {pid: p["obs_filter"]["n"] for pid, p in policies.items()}
    # p0 and p1 each act for 2 of the 4 agents of every copy: each saw its own agents' observations
    assert set(n) == {"p0", "p1"} and n["p0"] > 1000 and n["p1"] > 1000, n
    assert not torch.equal(policies["p0"]["obs_filter"]["mean"], policies["p1"]["obs_filter"]["mean"])


@pytest.mark.parametrize("args, message", [
    (["rollout.observation_filter=meanstd"], "rollout.observation_filter: 'meanstd' is not one of 'none', 'mean_std' "
                                             "(did you mean 'mean_std'?)"),
    (["rollout.observation_filter=mean_std", "rollout.observation_filter_clip=0"],
     "rollout.observation_filter_clip: must be positive, got 0"),
])
def test_bad_filter_settings_are_refused_with_one_line(refuse, args, message):
    p = refuse(*args, "tracking=none")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr[-2000:]
