"""The Algorithm seam: a user's algorithm is one module + one YAML file; learner state belongs to
the policy and is driven by the algorithm's hooks; the Trainer is the same loop for every algorithm."""

from __future__ import annotations

import os

import pytest
import torch

from rlrun.algos.ppo import KLState
from rlrun.app.cli import compose
from rlrun.app.runner import make_trainer_from, run
from rlrun.policy.policy import DEFAULT_POLICY_ID
from tests.conftest import REPO, run_cli, run_summary

PLUGINS = REPO / "tests" / "plugins"


@pytest.mark.slow
def test_a_plugin_algorithm_is_one_module_and_one_yaml_file_and_learns_cartpole(tmp_path):
    p = run_cli(["--config-dir", str(PLUGINS / "conf"), "algo=reinforce_bl", "plugins=[reinforce_baseline]",
                 "tracking=none", "rollout.rollout_fragment_length=128", "stop.timesteps_total=200000",
                 "+stop.rollout.episode_return_mean=150"], tmp_path,
                env={"PYTHONPATH": os.pathsep.join([str(REPO), str(PLUGINS)])})
    assert p.returncode == 0, p.stderr[-2000:]
    summary = run_summary(p.stdout)
    assert summary["stopped"].startswith("rollout/episode_return_mean"), summary
    assert float(summary["final"]) >= 150


def test_appo_adapts_its_kl_coefficient(tmp_path):
    cfg = compose(["+experiment=appo_cartpole", "rollout=local", "rollout.num_workers=0", "loss.kl_coeff=0.2",
                   "rollout.num_envs_per_worker=16", "stop.training_iteration=15", "tracking=none", "progress=false",
                   f"output_dir={tmp_path}"])
    r = run(cfg, launch_dir=tmp_path)
    coeffs = [h["train/kl_coeff"] for h in r.history]
    assert coeffs[0] == pytest.approx(0.2) and len(set(coeffs)) > 1, coeffs


def test_trainer_learns_every_policy_to_train_and_reports_honest_metrics(tmp_path):
    cfg = compose(["+experiment=ppo_cartpole", "tracking=none", f"output_dir={tmp_path}"], str(tmp_path))
    t = make_trainer_from(cfg, tmp_path)
    try:
        assert list(t.policies) == [DEFAULT_POLICY_ID] and t.policies_to_train == [DEFAULT_POLICY_ID]
        before = {k: v.clone() for k, v in t.policy.model.state_dict().items()}
        r = t.train()
        assert any(not torch.equal(v, before[k]) for k, v in t.policy.model.state_dict().items())
        # num_sgd_iter epochs over the batch per iteration: learn throughput counts rows trained, not sampled
        rows = cfg.algo.num_sgd_iter * r["rollout/env_steps_this_iter"]
        assert r["time/learn_throughput"] == pytest.approx(rows / r["time/learn_s"], rel=1e-6)
        assert "time/env_steps_trained_per_s" not in r
        assert not any(k.startswith("workers/") for k in r)  # no remote workers, no health to report
        assert t.policy.global_timestep == r["timesteps_total"]  # schedules see the steps of this batch
        t.policies_to_train = []  # a policy that is not trained keeps its weights
        frozen = {k: v.clone() for k, v in t.policy.model.state_dict().items()}
        t.train()
        assert all(torch.equal(v, frozen[k]) for k, v in t.policy.model.state_dict().items())
    finally:
        t.stop()


def test_ppo_kl_state_is_checkpointed_with_the_policy(tmp_path):
    cfg = compose(["+experiment=ppo_cartpole", "loss.kl_coeff=0.3", "tracking=none"], str(tmp_path))
    t = make_trainer_from(cfg, tmp_path)
    try:
        assert t.policy.state_as(KLState).kl_coeff == pytest.approx(0.3)
        t.train()
        state = t.get_state()
        assert state["policies"][DEFAULT_POLICY_ID]["learner"]["kl_coeff"] == t.policy.state_as(KLState).kl_coeff
        t.policy.state_as(KLState).kl_coeff = 99.0
        t.set_state(state)
        assert t.policy.state_as(KLState).kl_coeff == state["policies"][DEFAULT_POLICY_ID]["learner"]["kl_coeff"]
    finally:
        t.stop()
