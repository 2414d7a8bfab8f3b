"""RLlib's experiment files and command lines run by rlrun (issue 35, items 1-2): ``rlrun-rllib train
-f FILE`` / ``--run --env --config --stop``, ``--export`` to rlrun's experiment file, ``grid_search``
sweeps, ``rollout``/``evaluate`` of a checkpoint, and one line with exit 2 for every malformed or
unsupported file or line. The files here are written in RLlib's format for these tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest
import yaml

from rlrun.app.rllib_files import translate
from tests.conftest import REPO, run_summary

ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# the shape of RLlib's ppo/cartpole-ppo.yaml of Ray 2.x, with num_workers 0 and the old env id
PPO_FILE = """
cartpole-ppo:
    env: CartPole-v0
    run: PPO
    stop:
        episode_reward_mean: 150
        timesteps_total: 100000
    config:
        framework: tf
        gamma: 0.99
        lr: 0.0003
        num_workers: 0
        observation_filter: MeanStdFilter
        num_sgd_iter: 6
        vf_loss_coeff: 0.01
        model:
            fcnet_hiddens: [32]
            fcnet_activation: linear
            vf_share_layers: true
        enable_connectors: true
"""


def rllib(args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlrun.app.rllib_cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def runs(db: Path) -> list:
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.slow
def test_an_rllib_tuned_example_file_trains_to_its_own_stop_and_records(tmp_path):
    (tmp_path / "cartpole-ppo.yaml").write_text(PPO_FILE)
    p = rllib(["train", "-f", "cartpole-ppo.yaml"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert run_summary(p.stdout)["stopped"].startswith("rollout/episode_return_mean"), p.stdout[-1500:]
    assert "ignored (TensorFlow or RLlib-only): framework, enable_connectors" in p.stderr
    (run,) = runs(tmp_path / "mlflow.db")
    assert run.info.status == "FINISHED" and run.data.metrics["rollout/episode_return_mean"] >= 150
    assert run.data.params["algo.num_sgd_iter"] == "6" and run.data.params["loss.vf_coeff"] == "0.01"
    assert run.data.params["algo.sgd_minibatch_size"] == "128"  # RLlib's default where the file sets none
    assert run.data.params["env.id"] == "CartPole-v0"  # gymnasium still has it: the file's env, as in RLlib
    # rollout/evaluate of its checkpoint, RLlib's way
    ev = rllib(["rollout", run_summary(p.stdout)["checkpoint"], "--run", "PPO",
                "--episodes", "3"], tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert "mean" in ev.stdout and "CartPole-v0" in ev.stdout


@pytest.mark.slow
def test_rllib_train_command_line_trains_and_records(tmp_path):
    p = rllib(["train", "--run=PPO", "--env=CartPole-v1", "--config", '{"lr": 0.001, "num_sgd_iter": 4}',
               "--stop", '{"timesteps_total": 8000}', "--checkpoint-freq", "1"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert run_summary(p.stdout)["stopped"].startswith("timesteps_total")
    (run,) = runs(tmp_path / "mlflow.db")
    assert run.info.status == "FINISHED" and run.data.params["algo.lr"] == "0.001"
    assert run.data.params["checkpoint.every_n_iters"] == "1"


def test_export_writes_the_rlrun_experiment_that_composes_the_same_run(tmp_path):
    (tmp_path / "cartpole-ppo.yaml").write_text(PPO_FILE)
    p = rllib(["train", "-f", "cartpole-ppo.yaml", "--export", "conf"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "rlrun --config-dir conf +experiment=cartpole-ppo" in p.stdout
    exported = yaml.safe_load((tmp_path / "conf" / "experiment" / "cartpole-ppo.yaml").read_text())
    assert exported["algo"]["num_sgd_iter"] == 6 and exported["model"]["activation"] == "linear"
    assert exported["stop"] == {"timesteps_total": 100000, "rollout": {"episode_return_mean": 150}}
    def job_config(args: list[str]) -> dict:
        p = subprocess.run([sys.executable, "-m", "rlrun", *args, "--cfg", "job"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env=ENV)
        assert p.returncode == 0, p.stderr[-2000:]
        return yaml.safe_load(p.stdout)

    from_file = job_config(["--config-dir", "conf", "+experiment=cartpole-ppo"])
    direct = job_config(translate(yaml.safe_load(PPO_FILE)["cartpole-ppo"], "cartpole-ppo").overrides)
    for section in ("algo", "loss", "model", "rollout", "env", "stop"):
        assert from_file[section] == direct[section], section


def test_rllibs_sac_target_update_freq_counts_env_steps_and_becomes_rlruns_count_of_updates():
    def freq(**config):
        tr = translate({"run": "SAC", "env": "Pendulum-v1", "config": config}, "s")
        return next(o for o in tr.overrides if o.startswith("algo.target_network_update_freq="))

    assert freq() == "algo.target_network_update_freq=1"  # RLlib's 0: every update
    # 32 env steps at 2 updates of 32 rows per env step (training_intensity 64) are 64 updates
    assert freq(target_network_update_freq=32, train_batch_size=32, training_intensity=64) == \
        "algo.target_network_update_freq=64"
    # RLlib's native ratio with 4-step fragments: one update per 4 env steps
    assert freq(target_network_update_freq=32, train_batch_size=32, rollout_fragment_length=4) == \
        "algo.target_network_update_freq=8"
    # 4 updates after each 4-step fragment: RLlib checks the env steps since the last target update after each
    # update, and they grow once a step, so a freq of 2 env steps is a target update a step: every 4 updates
    assert freq(target_network_update_freq=2, train_batch_size=32, rollout_fragment_length=4,
                training_intensity=32) == "algo.target_network_update_freq=4"
    # a grid over n_step where the fragment is the file's own is one rlrun key: a sweep
    dqn = translate({"run": "DQN", "env": "CartPole-v1", "config": {"rollout_fragment_length": 4,
                                                                     "n_step": {"grid_search": [1, 3]}}}, "d")
    assert dqn.sweep and dqn.sweep_params == {"algo.n_step": "1,3"}


@pytest.mark.slow
def test_rllibs_sac_file_for_cartpole_trains_a_discrete_sac_with_the_files_settings(tmp_path):
    # RLlib's tuned sac/cartpole-sac.yaml, with a short stop (the whole file: 151.3 at 16,600 env steps, seed 0)
    (tmp_path / "cartpole-sac.yaml").write_text(
        "cartpole-sac:\n  env: CartPole-v1\n  run: SAC\n  stop: {episode_reward_mean: 150, timesteps_total: 600}\n"
        "  config: {framework: torch, gamma: 0.95, target_network_update_freq: 32, tau: 1.0, train_batch_size: 32,\n"
        "           num_steps_sampled_before_learning_starts: 200,\n"
        "           optimization: {actor_learning_rate: 0.005, critic_learning_rate: 0.005,"
        " entropy_learning_rate: 0.0001}}\n")
    p = rllib(["train", "-f", "cartpole-sac.yaml"], tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (run,) = runs(tmp_path / "mlflow.db")
    assert run.info.status == "FINISHED" and run.data.metrics["timesteps_total"] >= 600
    assert run.data.metrics["train/num_updates"] >= 400 and "train/loss/actor" in run.data.metrics
    params = run.data.params
    assert (params["algo.name"], params["model.name"], params["algo.gamma"]) == ("sac", "twin_q_mlp", "0.95")
    assert (params["algo.tau"], params["algo.target_network_update_freq"], params["algo.alpha_lr"]) == (
        "1.0", "32", "0.0001")
    # RLlib's SAC iterates for at least 1 s: every MLflow row is an iteration that long
    took = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(run.info.run_id,
                                                                                           "time/iteration_s")
    assert params["min_time_s_per_iteration"] == "1.0" and took and min(m.value for m in took) >= 1.0


def test_an_env_id_gymnasium_retired_is_mapped_to_its_successor_and_said_once():
    tr = translate({"run": "SAC", "env": "Pendulum-v0"}, "p")
    assert "env.id=Pendulum-v1" in tr.overrides
    assert tr.notes[0] == "env Pendulum-v0 is Pendulum-v1 in gymnasium: using Pendulum-v1"
    assert sum("Pendulum" in n for n in tr.notes) == 1


def test_keys_accepted_without_use_are_listed_nested_ones_included():
    config = {"framework": "tf", "replay_buffer_config": {"type": "MultiAgentReplayBuffer", "capacity": 5000,
                                                          "worker_side_prioritization": False}}
    tr = translate({"run": "DQN", "env": "CartPole-v1", "config": config}, "d")
    assert sorted(tr.ignored) == ["framework", "replay_buffer_config.worker_side_prioritization"]
    assert "algo.replay_capacity=5000" in tr.overrides and "algo.prioritized_replay=false" in tr.overrides


def test_older_rays_min_size_for_sampling_is_the_rows_stored_before_learning():
    tr = translate({"run": "TD3", "env": "Pendulum-v1", "config": {"replay_buffer_config": {
        "capacity": 10000, "min_size_for_sampling": 700}}}, "t")
    assert "algo.learning_starts=700" in tr.overrides and tr.ignored == []


def test_networks_given_different_activations_get_rlruns_one_and_a_note():
    tr = translate({"run": "SAC", "env": "Pendulum-v1", "config": {"policy_model_config": {"fcnet_activation":
                                                                                             "tanh"}}}, "x")
    assert "model.activation=tanh" in tr.overrides and sum(o.startswith("model.activation=") for o in tr.overrides) == 1
    assert "the file's networks have different activations (relu, tanh); rlrun's SAC model has one for all of them: " \
           "tanh" in tr.notes
    td3 = translate({"run": "TD3", "env": "Pendulum-v1", "config": {"critic_hidden_activation": "relu"}}, "y")
    assert not any("different activations" in n for n in td3.notes)  # the same as the actor's default


def test_older_rays_sac_model_keys_are_the_same_hiddens_and_activation():
    tr = translate({"run": "SAC", "env": "Pendulum-v1", "config": {
        "q_model_config": {"hidden_activation": "tanh", "hidden_layer_sizes": [64]},
        "policy_model_config": {"hidden_layer_sizes": [32, 32], "hidden_activation": "tanh"}}}, "s")
    assert {"model.critic_hiddens=[64]", "model.hiddens=[32, 32]", "model.activation=tanh"} <= set(tr.overrides)
    from rlrun.config.typed import ConfigError

    with pytest.raises(ConfigError, match="config: hidden_sizes in a Q/policy model config is not supported"):
        translate({"run": "SAC", "env": "Pendulum-v1", "config": {"q_model_config": {"hidden_sizes": [64]}}}, "s")


def test_rllibs_cpus_per_worker_size_the_ray_workers_and_are_ignored_without_them():
    from rlrun.config.typed import ConfigError

    ray = translate({"run": "PPO", "env": "CartPole-v1", "config": {"num_workers": 2, "num_cpus_per_worker": 0.5}}, "p")
    assert {"rollout=ray", "rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5"} <= set(ray.overrides)
    assert ray.ignored == []
    newest = translate({"run": "PPO", "env": "CartPole-v1", "config": {"num_env_runners": 1,
                                                                         "num_cpus_per_env_runner": 2}}, "p")
    assert "rollout.num_cpus_per_worker=2" in newest.overrides and newest.ignored == []
    # RLlib's default workers run here as env copies in this process: no actor to size
    local = translate({"run": "PPO", "env": "CartPole-v1", "config": {"num_cpus_per_worker": 2}}, "p")
    assert local.ignored == ["num_cpus_per_worker"]
    assert not any(o.startswith(("rollout=", "rollout.num_cpus_per_worker")) for o in local.overrides)
    for bad in (0, "two", True, float("inf")):
        with pytest.raises(ConfigError, match=f"config.num_cpus_per_worker: .*got {bad!r}"):
            translate({"run": "PPO", "env": "CartPole-v1", "config": {"num_workers": 1, "num_cpus_per_worker": bad}})


def test_grid_search_becomes_a_sweep_over_the_rlrun_key():
    spec = {"run": "PPO", "env": "CartPole-v1", "config": {"lr": {"grid_search": [0.001, 0.0003]},
                                                             "model": {"fcnet_hiddens": [32]}}}
    tr = translate(spec, "grid")
    assert tr.sweep and "algo.lr=0.001,0.0003" in tr.overrides
    assert sum(o.startswith("algo.lr=") for o in tr.overrides) == 1


def test_rllib_defaults_apply_where_a_file_sets_nothing():
    tr = translate({"run": "DQN", "env": "CartPole-v1", "config": {"model": {"fcnet_hiddens": [64]}}}, "d")
    o = dict(x.split("=", 1) for x in tr.overrides if "=" in x)
    assert o["algo.lr"] == "0.0005" and o["algo.sgd_minibatch_size"] == "32" and o["model.hiddens"] == "[64, 256]"
    # RLlib's "auto" fragment for DQN is n_step (1): one 32-row update per env step; prioritized replay
    assert o["algo.training_intensity"] == "32.0" and o["algo.epsilon"] == "[[0, 1.0], [10000, 0.02]]"
    assert o["algo.prioritized_replay"] == "true" and o["algo.replay_capacity"] == "50000"
    ppo = dict(x.split("=", 1) for x in translate({"run": "PPO", "env": "CartPole-v1"}, "p").overrides)
    # RLlib's 2 default rollout workers are as many env copies in-process
    assert ppo["algo.train_batch_size"] == "4000" and ppo["rollout.num_envs_per_worker"] == "2"
    assert "rollout" not in ppo and ppo["loss.clip_param"] == "0.3"


def test_an_iteration_lasts_rllibs_minimum_time_and_steps_the_older_names_included():
    def minimums(run, **config):
        tr = translate({"run": run, "env": "Pendulum-v1" if run in ("SAC", "TD3") else "CartPole-v1",
                        "config": config}, "m")
        assert not tr.ignored, tr.ignored
        return {k: v for k, v in (o.split("=", 1) for o in tr.overrides) if k.startswith("min_")}

    # RLlib's own defaults: SAC 1 s, A3C 5 s, A2C and APPO 10 s; none for PPO, PG, DQN, TD3
    assert [minimums(r).get("min_time_s_per_iteration") for r in ("SAC", "A3C", "A2C", "APPO")] == [
        "1", "5", "10", "10"]
    assert all("min_time_s_per_iteration" not in minimums(r) for r in ("PPO", "PG", "DQN", "TD3"))
    assert minimums("DQN") == minimums("TD3") == {"min_sample_timesteps_per_iteration": "1000"}  # RLlib's
    assert minimums("SAC", min_time_s_per_iteration=None) == minimums("SAC", min_time_s_per_iteration=0) == {
        "min_sample_timesteps_per_iteration": "100", "min_time_s_per_iteration": "0"}
    assert minimums("A2C", min_iter_time_s=3) == {"min_time_s_per_iteration": "3"}  # Ray 1.x's first name
    grid = translate({"run": "SAC", "env": "Pendulum-v1", "config": {"min_time_s_per_iteration": {
        "grid_search": [0, 2]}}}, "g")
    assert grid.sweep and grid.sweep_params["min_time_s_per_iteration"] == "0,2"
    assert minimums("A2C", min_time_s_per_reporting=2) == {"min_time_s_per_iteration": "2"}  # Ray 1.x's name
    # an on-policy run repeats its rounds until that many env steps, as RLlib repeats its training step
    assert minimums("PPO", timesteps_per_iteration=8000) == {"min_sample_timesteps_per_iteration": "8000"}
    assert minimums("PPO", min_sample_timesteps_per_reporting=100, min_sample_timesteps_per_iteration=9000) == {
        "min_sample_timesteps_per_iteration": "9000"}  # today's name wins over the older one
    sac = translate({"run": "SAC", "env": "Pendulum-v1", "config": {"timesteps_per_iteration": 1000}}, "s")
    assert "min_sample_timesteps_per_iteration=1000" in sac.overrides


@pytest.mark.parametrize(("run", "config", "rows", "updates", "iteration"), [
    ("SAC", {}, 1, 1, "100"),  # RLlib's SAC: one env step, one update of 256 rows; 100 env steps an iteration
    ("SAC", {"rollout_fragment_length": 4, "train_batch_size": 64}, 4, 1, "100"),  # a 4-step fragment, one update
    ("SAC", {"n_step": 3, "min_sample_timesteps_per_iteration": 0}, 3, 1, None),  # RLlib's auto fragment: n_step
    ("SAC", {"training_intensity": 1024.0}, 1, 4, "100"),  # 4x the natural 256 / 1: four updates after each step
    ("SAC", {"training_intensity": 32.0}, 8, 1, "100"),  # 1/8 of it: fragments of 8 steps before each update
    ("SAC", {"num_envs_per_worker": 4, "min_sample_timesteps_per_iteration": 2}, 4, 1, None),  # each copy's step
    # calculate_rr_weights counts the local worker as a sampler: natural 32 / (1 x 1 x 3), 64 / 10.7 = 6 updates
    # after the two remote workers' fragments
    ("DQN", {"num_workers": 2, "training_intensity": 64, "train_batch_size": 32, "n_step": 1}, 2, 6, "1000"),
    ("TD3", {"training_intensity": 400}, 1, 1, "1000"),  # SimpleQ's step: one update a fragment, no intensity
])
def test_an_off_policy_file_alternates_sampling_and_updates_as_rllibs_training_step_does(run, config, rows, updates,
                                                                                          iteration):
    tr = translate({"run": run, "env": "Pendulum-v1" if run != "DQN" else "CartPole-v1", "config": config}, "s")
    o = dict(x.split("=", 1) for x in tr.overrides if "=" in x)
    assert o["algo.train_batch_size"] == str(rows)
    # per round, as rlrun's replay_steps counts them from the replayed rows per env step
    assert round(float(o["algo.training_intensity"]) * rows / int(o["algo.sgd_minibatch_size"])) == updates
    assert o.get("min_sample_timesteps_per_iteration") == iteration
    assert any("RLlib's TD3 ignores it" in n for n in tr.notes) == ("training_intensity" in config and run == "TD3")


def test_a_translated_sac_file_updates_once_per_env_step_as_rllibs_training_step():
    """The rounds of one iteration alternate one env step and one update (RLlib's order), so the updates are
    the env steps sampled once learning starts, and the fragments are one step long."""
    from rlrun import make_trainer

    tr = translate({"run": "SAC", "env": "Pendulum-v1", "config": {
        "num_steps_sampled_before_learning_starts": 50, "min_sample_timesteps_per_iteration": 120,
        "min_time_s_per_iteration": 0, "train_batch_size": 32,
        "q_model_config": {"fcnet_hiddens": [16]}, "policy_model_config": {"fcnet_hiddens": [16]}}}, "s")
    trainer = make_trainer([*tr.overrides, "tracking=none", "evaluation.interval=0", "checkpoint.every_n_iters=0"])
    try:
        result = trainer.train()
        assert result["rollout/env_steps_this_iter"] == 120
        assert result["train/num_updates"] == 120 - 50 + 1  # from the step that stores the 50th row on
        fragment = trainer.workers.local_worker.fragment_length
        assert fragment == 1
    finally:
        trainer.stop()


BAD = {
    "not yaml": ("bad.yaml", "a: [1, 2\n", "not valid YAML"),
    "not a mapping": ("bad.yaml", "- 1\n- 2\n", "expected RLlib's format"),
    "experiment not a mapping": ("bad.yaml", "x: 3\n", "x: expected a mapping"),
    "unknown spec key": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, stopp: {}}\n", "x.stopp: not a key"),
    "unknown algorithm": ("bad.yaml", "x: {run: IMPALA, env: CartPole-v1}\n", "x.run: 'IMPALA' is not an algorithm"),
    "misspelled algorithm": ("bad.yaml", "x: {run: PP0, env: CartPole-v1}\n", "did you mean 'PPO'"),
    "unknown config key": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, config: {num_sgd_iters: 3}}\n",
                           "x.config.num_sgd_iters: not an RLlib key rlrun supports (did you mean 'num_sgd_iter'?)"),
    "unknown model key": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, config: {model: {fcnet_hidden: [8]}}}\n",
                          "config.model.fcnet_hidden: not a model key"),
    "bad activation": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, config: {model: {fcnet_activation: softsign}}}\n",
                       "config.model.fcnet_activation: 'softsign' is not supported"),
    "bad filter": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, config: {observation_filter: ConcurrentMeanStd}}\n",
                   "config.observation_filter: 'ConcurrentMeanStd' is not supported"),
    "env without successor": ("bad.yaml", "x: {run: PPO, env: Pong-ram-v9}\n",
                              "x.env: 'Pong-ram-v9' is not a gymnasium"),
    "missing env": ("bad.yaml", "x: {run: PPO}\n", "x.env: expected a gymnasium env id"),
    "unknown stop key": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, stop: {episode_len_mean: 100}}\n",
                         "x.stop.episode_len_mean: not a stop key"),
    "stop value not a number": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, stop: {timesteps_total: lots}}\n",
                                "x.stop.timesteps_total: expected a number"),
    "exploration type": ("bad.yaml", "x: {run: DQN, env: CartPole-v1, config: {exploration_config: "
                         "{type: SoftQ}}}\n", "exploration_config.type: 'SoftQ' is not supported for DQN"),
    "grid over a sampling key": ("bad.yaml", "x: {run: PPO, env: CartPole-v1, config: "
                                 "{timesteps_per_iteration: {grid_search: [100, 200]}}}\n",
                                 "config.min_sample_timesteps_per_iteration (timesteps_per_iteration / "),
    "unsupported use_critic": ("bad.yaml", "x: {run: A2C, env: CartPole-v1, config: {use_critic: false}}\n",
                               "config.use_critic: False is not supported"),
    "file missing": ("", "", "nope.yaml: cannot read the file"),
    "bad --config JSON": (None, ["--run=PPO", "--env=CartPole-v1", "--config", "{lr: 1}"], "--config: not valid JSON"),
    "--run missing": (None, ["--env=CartPole-v1"], "--run: missing"),
    "unknown option": (None, ["--run=PPO", "--env=CartPole-v1", "--num-workers=2"],
                       "--num-workers=2: not an option of rlrun-rllib train"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_a_malformed_or_unsupported_file_or_line_gets_one_line_and_exit_2(case, tmp_path):
    name, content, expect = BAD[case]
    if name is None:
        args = ["train", *content]
    elif name == "":
        args = ["train", "-f", "nope.yaml"]
    else:
        (tmp_path / name).write_text(textwrap.dedent(content))
        args = ["train", "-f", name]
    p = rllib(args, tmp_path, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr, p.stdout[-500:])
    assert lines[0].startswith("rlrun-rllib: ") and expect in lines[0], lines[0]
    assert not (tmp_path / "mlflow.db").exists()  # refused before anything ran


@pytest.mark.slow
def test_a_grid_search_file_runs_as_one_sweep_with_a_run_per_setting(tmp_path):
    (tmp_path / "grid.yaml").write_text(textwrap.dedent("""
        cartpole-grid:
            env: CartPole-v1
            run: PPO
            stop: {timesteps_total: 2000}
            config:
                num_workers: 0
                train_batch_size: 1000
                num_sgd_iter: 2
                lr: {grid_search: [0.001, 0.0003]}
        """))
    p = rllib(["train", "-f", "grid.yaml"], tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "2 jobs, 2 finished, 0 failed" in p.stdout
    found = runs(tmp_path / "mlflow.db")
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert sorted(r.data.params["algo.lr"] for r in children) == ["0.0003", "0.001"]


def test_grid_values_are_translated_and_exported_to_hydras_sweeper(tmp_path):
    from rlrun.app.rllib_files import to_experiment_yaml

    spec = {"run": "PPO", "env": "CartPole-v1",
            "config": {"observation_filter": {"grid_search": ["NoFilter", "MeanStdFilter"]},
                       "model": {"fcnet_hiddens": {"grid_search": [[32], [64, 64]]}}}}
    tr = translate(spec, "g")
    assert "rollout.observation_filter=none,mean_std" in tr.overrides
    assert "model.hiddens=[32],[64, 64]" in tr.overrides
    exported = yaml.safe_load(to_experiment_yaml(tr.overrides, tr.sweep_params))
    assert exported["hydra"]["sweeper"]["params"]["rollout.observation_filter"] == "none,mean_std"
    assert "observation_filter" not in exported.get("rollout", {})


def test_ddpg_and_td3_twin_q_and_target_smoothing_follow_rllibs_flags():
    def o(run, **config):
        return dict(x.split("=", 1) for x in translate({"run": run, "env": "Pendulum-v1", "config": config},
                                                       "x").overrides)

    assert (o("DDPG")["model.num_critics"], o("DDPG")["algo.target_noise"]) == ("1", "0.0")
    assert (o("TD3")["model.num_critics"], o("TD3")["algo.target_noise"]) == ("2", "0.2")
    twin = o("DDPG", twin_q=True, smooth_target_policy=True, target_noise=0.3)
    assert (twin["model.num_critics"], twin["algo.target_noise"]) == ("2", "0.3")
    assert o("DDPG", target_noise=0.3)["algo.target_noise"] == "0.0"  # no smoothing unless asked for
    assert o("DDPG")["algo.exploration_noise"] == "0.075933"  # OU's stationary scale on [-1, 1]


def test_override_values_keep_their_type_through_hydra():
    from rlrun.app.rllib_config import fmt

    assert [fmt(v) for v in ("mean_std", "true", "null", "1e3", "CartPole-v1")] == [
        "mean_std", '"true"', '"null"', '"1e3"', "CartPole-v1"]
    assert fmt({"sampler": 0.5, "data/x": 0.5}) == "{sampler: 0.5, data/x: 0.5}"
