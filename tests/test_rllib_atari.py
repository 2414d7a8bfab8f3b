"""RLlib's Atari tuned files under ``rlrun-rllib``: an ``env: {grid_search: [...]}`` becomes one sweep over
``env.id``; the gym era's Atari ids (``BreakoutNoFrameskip-v4``) are ale-py's; each game gets RLlib's DeepMind
preprocessing as rlrun wrappers and RLlib's vision net as the algorithm's convolutional model (its filters,
its padding); an Atari game's rewards are clipped to their sign unless the file says otherwise. The files
here have the shape of RLlib's ``dqn/atari-dqn.yaml``, ``ppo/atari-ppo.yaml`` and ``sac/atari-sac.yaml``."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from rlrun.app.rllib_files import to_experiment_yaml, translate
from tests.test_rllib_cli import rllib, runs

pytest.importorskip("ale_py", reason="rlrun's atari extra (pip install -e '.[atari]')")

DQN_FILE = """
atari-basic-dqn:
    env:
        grid_search:
            - BreakoutNoFrameskip-v4
            - PongNoFrameskip-v4
    run: DQN
    config:
        framework: tf
        double_q: false
        dueling: false
        num_atoms: 1
        noisy: false
        replay_buffer_config:
          type: MultiAgentReplayBuffer
          min_size_for_sampling: 20000
          capacity: 1000000
        n_step: 1
        target_network_update_freq: 8000
        lr: .0000625
        adam_epsilon: .00015
        hiddens: [512]
        rollout_fragment_length: 4
        train_batch_size: 32
        exploration_config:
          epsilon_timesteps: 200000
          final_epsilon: 0.01
        num_gpus: 0.2
        min_sample_timesteps_per_iteration: 10000
"""
PPO_FILE = """
atari-ppo:
    env:
        grid_search: [ALE/Breakout-v5, ALE/Qbert-v5]
    run: PPO
    config:
        framework: torch
        env_config: {frameskip: 1, full_action_space: false, repeat_action_probability: 0.0}
        lambda: 0.95
        kl_coeff: 0.5
        clip_rewards: True
        clip_param: 0.1
        vf_clip_param: 10.0
        entropy_coeff: 0.01
        train_batch_size: 5000
        rollout_fragment_length: 100
        sgd_minibatch_size: 500
        num_sgd_iter: 10
        num_env_runners: 10
        num_envs_per_env_runner: 5
        batch_mode: truncate_episodes
        observation_filter: NoFilter
        model: {vf_share_layers: true}
        num_gpus: 1
"""
SAC_FILE = """
atari-sac-tf-and-torch:
    env: {grid_search: [MsPacmanNoFrameskip-v4, PongNoFrameskip-v4]}
    run: SAC
    stop: {timesteps_total: 20000000}
    config:
        framework: {grid_search: [tf, torch]}
        gamma: 0.99
        q_model_config: {hidden_activation: relu, hidden_layer_sizes: [512]}
        policy_model_config: {hidden_activation: relu, hidden_layer_sizes: [512]}
        tau: 1.0
        target_network_update_freq: 8000
        target_entropy: auto
        clip_rewards: 1.0
        no_done_at_end: False
        n_step: 1
        rollout_fragment_length: 1
        replay_buffer_config:
          type: MultiAgentPrioritizedReplayBuffer
          capacity: 1000000
          min_size_for_sampling: 100000
          prioritized_replay_alpha: 0.6
          prioritized_replay_beta: 0.4
          prioritized_replay_eps: 1e-6
        train_batch_size: 64
        min_sample_timesteps_per_iteration: 4
        optimization: {actor_learning_rate: 0.0003, critic_learning_rate: 0.0003, entropy_learning_rate: 0.0003}
        num_workers: 0
        num_gpus: 1
        metrics_smoothing_episodes: 5
"""
LIVES = "{name: episodic_life}, {name: fire_reset, missing_ok: true}"
DEEPMIND = ("[{name: atari_preprocessing, noop_max: 30, frame_skip: 4, screen_size: 84}, "
            f"{LIVES}, {{name: frame_stack, stack_size: 4}}]")
RLLIB_84 = "[[16, 8, 4], [32, 4, 2], [256, 11, 1]]"


def _translated(text: str):
    ((name, spec),) = yaml.safe_load(text).items()
    tr = translate(spec, name)
    return tr, dict(o.lstrip("+").split("=", 1) for o in tr.overrides if "=" in o)


@pytest.mark.parametrize(("text", "model", "envs", "extra"), [
    (DQN_FILE, "q_cnn", "BreakoutNoFrameskip-v4,PongNoFrameskip-v4",
     {"model.hiddens": "[512]", "algo.adam_eps": "0.00015", "algo.clip_rewards": "true", "model.dueling": "false"}),
    (PPO_FILE, "cnn", '"ALE/Breakout-v5","ALE/Qbert-v5"',
     {"model.hiddens": "[]", "model.vf_share_layers": "true", "algo.clip_rewards": "true",
      "env.kwargs": "{frameskip: 1, full_action_space: false, repeat_action_probability: 0.0}"}),
    (SAC_FILE, "twin_q_cnn", "MsPacmanNoFrameskip-v4,PongNoFrameskip-v4",
     {"model.hiddens": "[512]", "model.critic_hiddens": "[512]", "algo.clip_rewards": "1.0", "algo.tau": "1.0",
      "min_time_s_per_iteration": "1"}),  # RLlib's SAC: its file's 4-step iterations last a second each
], ids=["dqn", "ppo", "sac"])
def test_rllibs_atari_files_are_a_sweep_over_their_games_with_deepmind_frames_and_the_vision_net(text, model, envs,
                                                                                                    extra):
    tr, o = _translated(text)
    assert tr.sweep and tr.sweep_params["env.id"] == envs and o["env.id"] == envs
    assert f"model={model}" in tr.overrides and not any(x.startswith("model=") and x != f"model={model}"
                                                         for x in tr.overrides)
    assert o["env.wrappers"] == DEEPMIND  # 4 frames per action, also on v5 once env_config sets frameskip 1
    assert (o["model.conv_filters"], o["model.conv_padding"]) == (RLLIB_84, "same_but_last")
    assert {k: o[k] for k in extra} == extra
    assert any("a lost life ends the episode" in n and "scaled to [0, 1]" in n for n in tr.notes)
    assert any(n.startswith("q_model_config / policy_model_config") for n in tr.notes) == (model == "twin_q_cnn")
    # the exported experiment sweeps the games with Hydra's sweeper
    exported = yaml.safe_load(to_experiment_yaml(tr.overrides, tr.sweep_params))
    assert exported["hydra"]["sweeper"]["params"]["env.id"] == envs and "id" not in exported.get("env", {})


def test_a_v5_game_that_skips_frames_itself_is_not_skipped_twice_and_ram_games_stay_vectors():
    _, o = _translated("x: {run: PPO, env: ALE/Pong-v5}")
    assert o["env.wrappers"] == DEEPMIND.replace("frame_skip: 4", "frame_skip: 1") and o["model"] == "cnn"
    _, o = _translated("x: {run: PPO, env: ALE/Pong-v5, config: {env_config: {obs_type: ram}, "
                       "model: {fcnet_hiddens: [64]}}}")
    assert "env.wrappers" not in o and (o["model"], o["model.hiddens"]) == ("mlp", "[64]")
    _, o = _translated("x: {run: PPO, env: PongNoFrameskip-v4, config: {clip_rewards: false, "
                       "model: {dim: 42, framestack: false, conv_filters: [[8, [4, 4], 2], [16, 21, 1]]}}}")
    preprocess = "{name: atari_preprocessing, noop_max: 30, frame_skip: 4, screen_size: 42}"
    assert o["env.wrappers"] == f"[{preprocess}, {LIVES}]"
    assert o["model.conv_filters"] == "[[8, 4, 2], [16, 21, 1]]" and o["algo.clip_rewards"] == "false"


def test_the_gym_eras_atari_ids_are_ale_pys_and_other_ids_are_not_guessed(monkeypatch):
    import gymnasium as gym

    import rlrun.envs.make as make

    monkeypatch.delitem(gym.registry, "Pong-v4", raising=False)  # as before ale-py is imported

    assert [make.env_package(i) for i in ("BreakoutNoFrameskip-v4", "PongDeterministic-v4", "Pong-ram-v0",
                                          "ALE/Pong-v5", "Pong-v4")] == ["ale_py"] * 5
    assert [make.env_package(i) for i in ("CartPole-v1", "Pong-v9", "MiniGrid-Empty-5x5-v0")] == [None, None,
                                                                                                  "minigrid"]
    monkeypatch.setattr(make, "find_spec", lambda name: None)  # without ale-py, Pong-v4 may be a typo: no guess
    assert make.env_package("Pong-v4") is None and make.env_package("PongNoFrameskip-v4") == "ale_py"


def test_an_env_grid_takes_the_experiments_env_over_the_configs_and_runs_each_env_once():
    tr, o = _translated("x: {run: PPO, env: {grid_search: [Acrobot-v0, Acrobot-v1, CartPole-v1]}, "
                        "config: {env: MountainCar-v0}}")
    assert o["env.id"] == tr.sweep_params["env.id"] == "Acrobot-v1,CartPole-v1"  # v0 is v1 in gymnasium
    assert any("Acrobot-v0 is Acrobot-v1" in n for n in tr.notes)


@pytest.mark.slow
def test_an_rllib_atari_file_runs_each_game_as_a_run_of_one_sweep(tmp_path):
    (tmp_path / "atari-dqn.yaml").write_text(textwrap.dedent(DQN_FILE))
    p = rllib(["train", "-f", "atari-dqn.yaml", "algo.learning_starts=64", "algo.train_batch_size=128",
               "stop.timesteps_total=128", "algo.replay_capacity=1000", "min_sample_timesteps_per_iteration=0",
               "progress=false"], tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "2 jobs, 2 finished, 0 failed" in p.stdout
    children = [r for r in runs(tmp_path / "mlflow.db") if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.params["env.id"] for r in children) == ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"]
    for r in children:
        assert r.info.status == "FINISHED" and 128 <= r.data.metrics["timesteps_total"] < 1000  # not the file's 10k
        assert (r.data.params["model.name"], r.data.params["model.conv_padding"]) == ("q_cnn", "same_but_last")
        assert r.data.params["algo.clip_rewards"] == "True" and r.data.params["algo.adam_eps"] == "0.00015"


BAD = {
    "games that translate apart": ("x: {run: DQN, env: {grid_search: [CartPole-v1, PongNoFrameskip-v4]}}",
                                   "x.env.grid_search: CartPole-v1 and PongNoFrameskip-v4 need different rlrun "
                                   "settings"),
    "empty env grid": ("x: {run: DQN, env: {grid_search: []}}", "x.env.grid_search: expected a list of env ids"),
    "rllib's own preprocessor": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {preprocessor_pref: rllib}}",
                                 "config.preprocessor_pref: 'rllib' is not supported on Atari envs"),
    "a frame size without filters": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {model: {dim: 64}}}",
                                     "config.model.dim: rlrun-rllib has RLlib's default conv_filters for 96x96, "
                                     "84x84, 42x42, 10x10 frames, not 64x64; give config.model.conv_filters"),
    "frame stacking not a flag": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {model: {framestack: 'no'}}}",
                                  "config.model.framestack: expected true or false, got 'no'"),
    "a game's settings swept": ("x: {run: PPO, env: ALE/Pong-v5, config: {env_config: {frameskip: {grid_search: "
                                "[1, 4]}}}}", "config.env_config: grid_search on an Atari game's settings"),
    "a game's env_config not a mapping": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {env_config: [1]}}",
                                          "config.env_config: expected a mapping of the env's keyword arguments"),
    "layer sizes not a list": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {model: {post_fcnet_hiddens: 5}}}",
                               "config.model.post_fcnet_hiddens: expected a list of layer sizes"),
    "q hiddens not a list": ("x: {run: SAC, env: Pendulum-v1, config: {q_model_config: {fcnet_hiddens: 5}}}",
                             "config.q_model_config.fcnet_hiddens: expected a list of layer sizes"),
    "a frame size of none": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {model: {dim: 0}}}",
                             "config.model.dim: expected a positive frame size, got 0"),
    "oblong kernels": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {model: {conv_filters: [[16, [8, 4], 4]]}}}",
                       "config.model.conv_filters[0]: expected [out_channels, kernel, stride] with square kernels"),
    "lstm on frames": ("x: {run: PPO, env: PongNoFrameskip-v4, config: {model: {use_lstm: true}}}",
                       "x.config.model.use_lstm: not supported on Atari frames"),
    "conv filters on vectors": ("x: {run: PPO, env: CartPole-v1, config: {model: {conv_filters: [[16, 4, 2]]}}}",
                                "config.model.conv_filters: [[16, 4, 2]] is not supported (rlrun-rllib gives "
                                "convolutions to Atari envs' frames"),
    "env_config not a mapping": ("x: {run: PPO, env: CartPole-v1, config: {env_config: 3}}",
                                 "config.env_config: expected a mapping of the env's keyword arguments, got 3"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_an_atari_file_rlrun_cannot_run_as_rllib_would_gets_one_line_and_exit_2(case, tmp_path):
    text, expect = BAD[case]
    (tmp_path / "bad.yaml").write_text(text + "\n")
    p = rllib(["train", "-f", "bad.yaml"], tmp_path, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr, p.stdout[-500:])
    assert lines[0].startswith("rlrun-rllib: ") and expect in lines[0], lines[0]
    assert not (tmp_path / "mlflow.db").exists()
