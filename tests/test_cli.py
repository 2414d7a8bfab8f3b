import re
from importlib.resources import files

import pytest
from mlflow.tracking import MlflowClient

from rlrun.app.cli import compose
from rlrun.config.typed import ConfigError

EXPERIMENTS = sorted(p.name[:-5] for p in files("rlrun.conf").joinpath("experiment").iterdir()
                     if p.name.endswith(".yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name, tmp_path):
    if name in ("bc_cartpole", "marwil_cartpole"):  # they train from files and say how to record some
        with pytest.raises(ConfigError, match="input: this run trains from recorded data"):
            compose([f"+experiment={name}"])
        import gymnasium as gym
        from rlrun.offline import EpisodeWriter

        env = gym.make("CartPole-v1")
        with EpisodeWriter(tmp_path, env.observation_space, env.action_space) as w:
            w.add_step(env.observation_space.sample(), 0, 1.0, True, False, env.observation_space.sample())
        cfg = compose([f"+experiment={name}", f"input={tmp_path}"])
    else:
        cfg = compose([f"+experiment={name}"])
    assert cfg.experiment == name
    assert cfg.stop


@pytest.mark.parametrize("group", ["algo=pg", "tracking=none", "debug=fast", "model=mlp", "env=cartpole"])
def test_groups_compose(group):
    compose([group])


def test_python_dash_m_runs_debug_fast_and_prints_progress(cli):
    p = cli("+experiment=ppo_cartpole", "debug=fast")
    assert p.returncode == 0, p.stderr
    assert "stopped: training_iteration = 3 >= 3" in p.stdout


@pytest.mark.parametrize("args, hint", [
    (["algo=PPO"], "algo: unknown config 'PPO' (did you mean 'ppo'? config names are lower case)"),
    (["model=MLP"], "did you mean 'mlp'?"),
    (["env=CartPole-v1"], "for a gymnasium env id use env.id=CartPole-v1"),
    (["rollout=Ray"], "did you mean 'ray'?"),
    (["+experiment=PPO_cartpole"], "did you mean 'ppo_cartpole'?"),
    (["experiment=ppo_cartpole"], "add it with a plus, e.g. +experiment=<name>"),
    (["stop.timesteps=5000"], "stop.timesteps: unknown key (did you mean 'timesteps_total'?)"),
    (["env.kwargs.x=1"], "To add a key that is not in the config use +env.kwargs.x=<value>"),
    (["+experiment=ppo_cartpole", "algo=dqn"], "algo.gae_lambda is set by +experiment=ppo_cartpole, not by you"),
    (["loss=seed_pg", "plugins=[seedpg]"], "'seed_pg' is a registered loss; use loss=custom loss.name=seed_pg"),
    (["multiagent.policies={me: {}}"], "replace it whole with ~multiagent.policies +multiagent.policies=<value>"),
    (["+experiment=ppo_breakout", "env.kwargs={episodic_life: true}"], "~env.kwargs +env.kwargs=<value>"),
])
def test_common_mistakes_get_one_line_with_the_fix(refuse, tmp_path, args, hint):
    (tmp_path / "seedpg.py").write_text(
        "from rlrun import LOSSES, LossOutput, SampleBatch as SB\n"
        "@LOSSES.register('seed_pg', requires=(SB.OBS, SB.ACTIONS, SB.REWARDS), terms=('pg',))\n"
        "def seed_pg(policy, model, dist_class, batch):\n"
        "    return LossOutput(model(batch[SB.OBS]).dist_inputs.sum(), {'pg': 0.0})\n")
    p = refuse(*args, "tracking=none")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("rlrun: error: "), p.stderr[-2000:]
    assert hint in lines[0], lines[0]


@pytest.mark.parametrize(("preset", "bad", "section", "name"), [
    ("ppo_cartpole", "algo.lrr", "algo", "ppo"),
    ("dqn_cartpole", "algo.gama", "algo", "dqn"),
    ("ppo_cartpole", "loss.clip_parm", "loss", "ppo_clip"),
    ("sac_pendulum", "algo.tauu", "algo", "sac"),
])
def test_an_unknown_key_offers_this_runs_own_keys_and_a_suggestion_that_runs(refuse, preset, bad, section, name):
    from dataclasses import fields

    from rlrun.core.registry import ALGOS, LOSSES

    p = refuse(f"+experiment={preset}", f"{bad}=0.1", "tracking=none")
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 2 and line.startswith(f"rlrun: error: {bad}: unknown key (did you mean "), line
    suggested = line.split("did you mean ")[1].split("?")[0]
    compose([f"+experiment={preset}", f"{suggested}=0.1"])  # the suggestion, as printed, is accepted
    own = [f.name for f in fields((ALGOS if section == "algo" else LOSSES).entry(name).config_cls)]
    assert line.endswith(f"Valid keys for {section} {name}: {', '.join(own)}.")  # this run's keys, no other's
    assert "+" + bad not in line  # no "+algo.lrr=...": the schema refuses new keys


def test_another_algorithms_key_names_its_algorithm(refuse):
    p = refuse("+experiment=ppo_cartpole", "algo.double_q=true", "tracking=none")
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 2
    assert line.startswith("rlrun: error: algo.double_q: a key of algo dqn, not of algo ppo (this run's algo)."), line
    assert "double_q" not in line.split("Valid keys for algo ppo: ")[1]


def test_help_is_rlruns_own_and_version_names_the_stack(cli):
    p = cli("--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: rlrun "), p.stdout[:500]
    for needle in ("+experiment=ppo_cartpole", "rlrun -m", "mlflow ui", "ppo_cartpole ", "algos: a2c, appo",
                   "losses:", "outputs/<date>/<time>-<pid>/"):
        assert needle in p.stdout, needle
    assert "powered by Hydra" not in p.stdout
    p = cli("--version")
    assert p.returncode == 0 and re.fullmatch(r"rlrun \d+\.\d+\.\d+ \(torch .*, ray .*\)\n", p.stdout), p.stdout


@pytest.mark.slow
def test_a_preset_on_another_env_drops_its_target_and_experiment_name(cli, tmp_path):
    p = cli("+experiment=ppo_cartpole", "env.id=Acrobot-v1", "stop.timesteps_total=1024", "progress=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "its target rollout/episode_return_mean >= 475 is dropped" in p.stdout
    assert "filed under experiment 'ppo_Acrobot-v1'" in p.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_experiment_by_name("ppo_Acrobot-v1") is not None
    assert client.get_experiment_by_name("ppo_cartpole") is None


def test_cfg_job_shows_the_presets_experiment_name(cli):
    p = cli("+experiment=ppo_cartpole", "--cfg", "job")
    assert p.returncode == 0 and "\nexperiment: ppo_cartpole\n" in p.stdout, p.stdout[-2000:]
    assert compose(["+experiment=ppo_cartpole", "env.id=Acrobot-v1"]).experiment == "ppo_Acrobot-v1"
    assert compose(["algo=pg"]).experiment is None


def test_verbose_flag_is_rlruns_and_long_floats_are_shortened_for_display(cli, monkeypatch):
    from rlrun.core.quiet import VERBOSE_ENV, short_floats, take_verbose_flag

    monkeypatch.setenv(VERBOSE_ENV, "0")  # recorded, so the "1" set below does not leak into later tests
    assert take_verbose_flag(["-v", "algo=pg", "--verbose"]) == ["algo=pg"]
    import os

    assert os.environ[VERBOSE_ENV] == "1"
    long = "algo.lr=0.0017692267954532756 x=1.5 y=2.5e-07 seed=3"
    assert short_floats(long) == "algo.lr=0.001769 x=1.5 y=2.5e-07 seed=3"
    assert short_floats("lr=1.2345678901234567e-05") == "lr=1.235e-05"
    p = cli("-v", "+experiment=ppo_cartpole", "debug=fast", "tracking=none")
    assert p.returncode == 0 and "stopped: training_iteration = 3 >= 3" in p.stdout, p.stderr[-2000:]
