"""Every invalid input is rejected before compute with one message naming the key and the value."""

import pytest

from rlrun.app.cli import compose
from rlrun.config.typed import ConfigError
from rlrun.sources.plugins import load_builtins
from rlrun.training.validate import build_config

load_builtins()

# (overrides, exit code, substrings the message must contain)
CLI_CASES = [
    (["+algo.num_sgd_iters=3"], 2, ["algo.num_sgd_iters: unknown key", "did you mean 'num_sgd_iter'"]),
    # Hydra's check of plain overrides, answered with the run's own algorithm's keys (no "+algo.foo": refused too)
    (["algo.foo=3"], 2, ["algo.foo: unknown key. Valid keys for algo ppo: name, lr, "]),
    (["algo.lr=abc"], 2, ["algo.lr: expected a number, got 'abc'"]),
    (["algo.num_sgd_iter=2.5"], 2, ["algo.num_sgd_iter: expected an integer, got 2.5"]),
    (["rollout.batch_mode=complete"], 2, ["rollout.batch_mode: 'complete' is not one of",
                                          "did you mean 'complete_episodes'"]),
    (["algo=ppoo"], 2, ["algo: unknown config 'ppoo'", "did you mean 'ppo'",
                        "Known algo configs: a2c, appo, bc, dqn, marwil, pg, ppo"]),
    (["algo.name=ppoo"], 2,
     ["algo.name: unknown algo 'ppoo'", "did you mean 'ppo'", "a2c, appo, bc, dqn, marwil, pg, ppo"]),
    (["loss.name=ppo_clp"], 2, ["loss.name: unknown loss 'ppo_clp'", "did you mean 'ppo_clip'", "pg, ppo_clip"]),
    (["model.name=mpl"], 2, ["model.name: unknown model 'mpl'", "did you mean 'mlp'"]),
    (["env.id=CartPole-v9"], 2, ["env.id: unknown env 'CartPole-v9'", "did you mean 'CartPole-v1'"]),
    (["+stop.rollout.episode_reward_mean=100"], 2,
     ["stop.rollout/episode_reward_mean", "not a metric rlrun reports", "did you mean 'rollout/episode_return_mean'"]),
    (["+experiment=ppo_cartpole", "rollout.num_envs_per_worker=16", "algo.train_batch_size=500"], 2,
     ["algo.train_batch_size: 500 is not a multiple", "32 x 16 x 1 = 512", "use algo.train_batch_size=512"]),
    (["+experiment=ppo_cartpole", "algo.train_batch_size=500"], 2,
     ["rollout.num_envs_per_worker: 'auto' needs algo.train_batch_size (500) to be a multiple of",
      "rollout_fragment_length x max(num_workers, 1) = 32 x 1 = 32"]),
    (["rollout=ray", "rollout.num_cpus_per_worker=0"], 2, ["rollout.num_cpus_per_worker: 0.0 must be positive"]),
    (["algo.sgd_minibatch_size=1024"], 2, ["algo.sgd_minibatch_size: 1024", "algo.train_batch_size=256"]),
    (["loss=custom"], 2, ["loss.name: missing mandatory value"]),
    (["algo=dqn", "loss=ppo_clip"], 2, ["loss.name: loss 'ppo_clip' needs batch columns",
                                        "'advantages', 'value_targets'", "algo 'dqn' does not produce"]),
    (["plugins=[no_such_module_xyz]"], 2, ["plugins[0]: cannot import module 'no_such_module_xyz'"]),
]


@pytest.mark.parametrize(("overrides", "code", "needles"), CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_cli_rejects_bad_input_with_one_clear_message(refuse, tmp_path, overrides, code, needles):
    p = refuse(*overrides, "tracking=none")
    assert p.returncode == code, p.stderr
    err = p.stderr
    for n in needles:
        assert n in err, err
    assert "Traceback" not in err and "Traceback" not in p.stdout
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran
    assert "iter " not in p.stdout


def test_algo_loss_mismatch_names_missing_columns():
    with pytest.raises(ConfigError, match=r"loss 'ppo_clip' needs batch columns \[.*'value_targets'.*\]"):
        compose(["algo=pg", "loss=ppo_clip"])


def test_loss_follows_algo_unless_set():
    for algo, loss in (("pg", "pg"), ("ppo", "ppo_clip"), ("a2c", "a2c"), ("dqn", "dqn_td"), ("appo", "ppo_clip")):
        assert compose([f"algo={algo}"]).loss.name == loss


def test_stop_spellings():
    c = compose(["+experiment=ppo_cartpole", "++stop={rollout/episode_return_mean: 400}"])
    assert c.stop["rollout/episode_return_mean"] == 400
    c = compose(["+experiment=ppo_cartpole", "stop.timesteps_total=1000"])
    assert c.stop == {"rollout/episode_return_mean": 475, "timesteps_total": 1000}
    with pytest.raises(ConfigError, match="stop: no stop criterion"):
        build_config({"stop": {}})
    with pytest.raises(ConfigError, match="stop.timesteps_total: expected a number"):
        build_config({"stop": {"timesteps_total": "soon"}})


def test_build_config_types_and_defaults():
    c = build_config({"algo": {"name": "ppo", "lr": 1}, "stop": {"training_iteration": 2}})
    assert c.algo.lr == 1.0 and isinstance(c.algo.lr, float)
    assert c.loss.name == "ppo_clip"  # plain data: the algorithm's default loss, as from the CLI
    with pytest.raises(ConfigError, match=r"seed: expected an integer, got True"):
        build_config({"seed": True})
    with pytest.raises(ConfigError, match=r"model.hiddens\[1\]: expected an integer"):
        build_config({"model": {"name": "mlp", "hiddens": [64, "x"]}})
    with pytest.raises(ConfigError, match="unknown key.*Valid keys: algo"):
        build_config({"algoo": {}})


def test_what_this_machine_can_hold_is_checked_for_runs_started_here_only():
    # a checkpoint trained with more Ray workers than this machine has CPUs: its config still loads to be
    # evaluated or exported here (for_run=False), but a run started here with it is refused
    raw = {"algo": {"name": "ppo", "train_batch_size": 256000}, "stop": {"training_iteration": 2},
           "rollout": {"num_workers": 1000, "ray": {"num_cpus": 2}}}
    assert build_config(raw, for_run=False).rollout.num_workers == 1000
    with pytest.raises(ConfigError, match="rollout.num_workers: 1000 workers"):
        build_config(raw)
