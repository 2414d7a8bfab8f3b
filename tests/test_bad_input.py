"""Every kind of bad input, through the real CLI: exit 2, one line on stderr naming the key (or the
file, module, env id) and the value, no traceback, and no MLflow run left RUNNING.

Each case calls the CLI's entry function in this process (tests/inprocess.py: ~0.1 s a case against
~2 s for a fresh interpreter). The cases in ``AS_PROCESS`` - a few of each kind: config value, name,
Hydra grammar, plugin, env, size, file, checkpoint, and those with MLflow tracking (a background
writer process, the store on disk) - also run as real ``python -m rlrun`` processes, a few at a time
beside the in-process ones, and must give the same exit status and the same line. One module fixture
runs everything; each case is then one parametrized test that reads its result.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cli
from tests.inprocess import cli_in_process

PPO = "+experiment=ppo_cartpole"
DQN = "+experiment=dqn_cartpole"
RUN_ID = "0123456789abcdef0123456789abcdef"  # no such MLflow run


@dataclass
class Case:
    args: list[str]
    expect: list[str]  # substrings of the one error line: the key and the value
    files: dict[str, str] = field(default_factory=dict)  # files written in the launch dir first
    checkpoint: str | None = None  # a tampering of a real checkpoint copied to ./ck (see tamper())
    tracked: bool = False  # run with MLflow tracking (default store) to check no run is left RUNNING


def c(*args: str, expect: list[str] | str, **kw) -> Case:
    return Case(list(args), [expect] if isinstance(expect, str) else expect, **kw)


PLUGIN_ENVS = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np
    from gymnasium.envs.classic_control import CartPoleEnv
    from rlrun import ENVS


    class OldApi(CartPoleEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return obs, r, term or trunc, info


    class WrongShape(CartPoleEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return np.zeros(7, np.float32), r, term, trunc, info


    class VectorReward(CartPoleEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return obs, np.array([r, r]), term, trunc, info


    class NeedsSize(CartPoleEnv):
        def __init__(self, size=3, render_mode=None):
            super().__init__(render_mode=render_mode)


    ENVS.add("old_api", OldApi, vector=False)
    ENVS.add("wrong_shape", WrongShape, vector=False)
    ENVS.add("vector_reward", VectorReward, vector=False)
    ENVS.add("needs_size", NeedsSize, vector=False)
''')

PLUGIN_CODE = textwrap.dedent('''
    import torch
    from torch import nn
    from rlrun import LOSSES, MODELS, LossOutput
    from rlrun.models.base import ModelOutput


    @MODELS.register("too_small")
    class TooSmall(nn.Module):
        def __init__(self, obs_space, action_space, num_outputs, config):
            super().__init__()
            self.lin = nn.Linear(4, num_outputs + 3)

        def forward(self, obs):
            return ModelOutput(self.lin(obs.float()), obs[:, 0])


    @LOSSES.register("per_row", requires=())
    def per_row(policy, model, dist_class, batch):
        return LossOutput(model(batch["obs"]).values)  # not a scalar
''')

CASES: dict[str, Case] = {
    # ---------------------------------------------------------------- values outside their domain
    "lr negative": c(PPO, "algo.lr=-1", expect="algo.lr: -1.0 must be positive"),
    "lr zero": c(PPO, "algo.lr=0", expect="algo.lr: 0.0 must be positive"),
    "lr nan": c(PPO, "algo.lr=nan", expect="algo.lr: nan must be a finite number"),
    "lr inf": c(PPO, "algo.lr=inf", expect="algo.lr: inf must be a finite number"),
    "lr 1e400": c(PPO, "algo.lr=1e400", expect="algo.lr: inf must be a finite number"),
    "lr text": c(PPO, "algo.lr=fast", expect=["algo.lr", "'fast'"]),
    "gamma above 1": c(PPO, "algo.gamma=1.5", expect="algo.gamma: 1.5 must be in [0, 1]"),
    "gamma negative": c(PPO, "algo.gamma=-0.1", expect="algo.gamma: -0.1 must be in [0, 1]"),
    "gae_lambda 5": c(PPO, "algo.gae_lambda=5.0", expect="algo.gae_lambda: 5.0 must be in [0, 1]"),
    "grad_clip negative": c(PPO, "algo.grad_clip=-1", expect="algo.grad_clip: -1.0 must be positive"),
    "grad_clip zero": c(PPO, "algo.grad_clip=0", expect="algo.grad_clip: 0.0 must be positive"),
    "adam_eps negative": c(PPO, "algo.adam_eps=-1", expect="algo.adam_eps: -1.0 must be positive"),
    "train_batch_size zero": c(PPO, "algo.train_batch_size=0", expect="algo.train_batch_size: 0 must be at least 1"),
    "train_batch_size negative": c(PPO, "algo.train_batch_size=-512", expect="algo.train_batch_size: -512"),
    "train_batch_size float": c(PPO, "algo.train_batch_size=1.5", expect=["algo.train_batch_size", "1.5"]),
    "train_batch_size huge": c(PPO, "algo.train_batch_size=1000000000000",
                               expect=["algo.train_batch_size: 1,000,000,000,000", "GiB"]),
    "num_envs huge": c(PPO, "rollout.num_envs_per_worker=100000000", "algo.train_batch_size=3200000000",
                       expect=["rollout.num_envs_per_worker: 100,000,000", "GiB"]),
    # sizes this machine cannot hold (rlrun/config/resources.py): refused before any env or Ray starts,
    # naming the key that was set and the estimate
    "num_envs in the millions": c(PPO, "rollout.num_envs_per_worker=50000000",
                                  expect=["rollout.num_envs_per_worker: 50,000,000", "GiB"]),
    "hiddens huge": c(PPO, "model.hiddens=[2000000000]", expect=["model.hiddens: [2000000000]", "GiB"]),
    "hiddens wide and deep": c(PPO, "model.hiddens=[100000,100000,100000]",
                               expect=["model.hiddens: [100000, 100000, 100000]", "parameters", "GiB"]),
    "lstm cell huge": c(PPO, "model=lstm", "model.cell_size=1000000", expect=["model.cell_size: 1000000", "GiB"]),
    "lstm post_hiddens huge": c(PPO, "model=lstm", "model.post_hiddens=[3000000000]",
                                expect=["model.post_hiddens: [3000000000]", "GiB"]),
    "cnn filters huge": c(PPO, "model=cnn", "model.conv_filters=[[100000,3,1],[100000,3,1]]",
                          expect=["model.conv_filters: [[100000, 3, 1], [100000, 3, 1]]", "GiB"]),
    "dqn q-model huge": c(DQN, "model.hiddens=[1000000,1000000]", expect=["model.hiddens: [1000000, 1000000]", "GiB"]),
    "replay capacity huge": c(DQN, "algo.replay_capacity=1000000000000",
                              expect=["algo.replay_capacity: 1,000,000,000,000", "GiB"]),
    "snapshot of an unknown policy": c("+experiment=ppo_tictactoe", "+multiagent.policies.past={snapshot_of: lerned}",
                                       expect=["multiagent.policies.past.snapshot_of: unknown policy 'lerned' "
                                               "(did you mean 'learned'?)"]),
    "seats shuffled in a one-agent env": c(PPO, "env.shuffle_seats=true",
                                           expect=["env.shuffle_seats: true needs a multi-agent env",
                                                   "env.id CartPole-v1 has one agent"]),
    "stop on a seat the env lacks": c("+experiment=ppo_tictactoe", "env.shuffle_seats=true",
                                      "++stop={eval/learned/seat/player_3/episode_return_mean: 0.5}",
                                      expect=["stop.eval/learned/seat/player_3/episode_return_mean: seat 'player_3' is "
                                              "not one of", "agents (player_1, player_2)"]),
    "policy model huge": c("+experiment=ppo_multi_cartpole", "+multiagent.policies.p0.model={hiddens:[2000000000]}",
                           expect=["multiagent.policies.p0.model.hiddens: [2000000000]", "GiB"]),
    "workers past the cpus": c(PPO, "rollout=ray", "rollout.num_workers=1000", "rollout.ray.num_cpus=2",
                               expect=["rollout.num_workers: 1000 workers", "need 1000 CPUs", "has 2"]),
    "worker cpus past the cpus": c(PPO, "rollout=ray", "rollout.num_workers=2", "rollout.num_cpus_per_worker=4",
                                   "rollout.ray.num_cpus=2", expect=["rollout.num_cpus_per_worker=4", "need 8 CPUs"]),
    "num_sgd_iter zero": c(PPO, "algo.num_sgd_iter=0", expect="algo.num_sgd_iter: 0 must be at least 1"),
    "minibatch zero": c(PPO, "algo.sgd_minibatch_size=0", expect="algo.sgd_minibatch_size: 0 must be at least 1"),
    "minibatch too big": c(PPO, "algo.sgd_minibatch_size=100000", expect="algo.sgd_minibatch_size: 100000"),
    "lr_schedule negative": c(PPO, "algo.lr_schedule=[[0,-1]]", expect="algo.lr_schedule"),
    "lr_schedule decreasing": c(PPO, "algo.lr_schedule=[[100,1e-3],[0,1e-4]]", expect=["algo.lr_schedule", "increase"]),
    "lr_schedule shape": c(PPO, "algo.lr_schedule=[[0]]", expect=["algo.lr_schedule", "[[env_step, value]"]),
    "lr ignored by schedule": c(PPO, "algo.lr=1e-3", "algo.lr_schedule=[[0,3e-4]]", expect=["algo.lr: 0.001"]),
    "clip_param negative": c(PPO, "loss.clip_param=-0.2", expect="loss.clip_param: -0.2 must be positive"),
    "clip_param zero": c(PPO, "loss.clip_param=0", expect="loss.clip_param: 0.0 must be positive"),
    "vf_coeff negative": c(PPO, "loss.vf_coeff=-1", expect="loss.vf_coeff: -1.0 must be >= 0"),
    "entropy nan": c(PPO, "loss.entropy_coeff=nan", expect="loss.entropy_coeff: nan must be a finite number"),
    "entropy negative": c(PPO, "loss.entropy_coeff=-0.1", expect="loss.entropy_coeff: -0.1 must be >= 0"),
    "kl_coeff negative": c(PPO, "loss.kl_coeff=-1", expect="loss.kl_coeff: -1.0 must be >= 0"),
    "kl_target zero": c(PPO, "loss.kl_target=0", expect="loss.kl_target: 0.0 must be positive"),
    "vf_clip negative": c(PPO, "loss.vf_clip_param=-1", expect="loss.vf_clip_param: -1.0 must be positive"),
    "normalize not bool": c(PPO, "loss.normalize_advantages=maybe", expect=["loss.normalize_advantages", "maybe"]),
    "hiddens zero": c(PPO, "model.hiddens=[0]", expect=["model.hiddens: [0]", "must be at least 1"]),
    "hiddens negative": c(PPO, "model.hiddens=[-5]", expect=["model.hiddens: [-5]", "must be at least 1"]),
    "hiddens one bad": c(PPO, "model.hiddens=[64,0]", expect=["model.hiddens: [64, 0]", "element 1"]),
    "hiddens scalar": c(PPO, "model.hiddens=64", expect=["model.hiddens", "expected a list", "64"]),
    "init_log_std 100": c(PPO, "model.init_log_std=100", expect="model.init_log_std: 100.0 must be between -20 and 5"),
    "activation typo": c(PPO, "model.activation=sigmoidx", expect=["model.activation: unknown 'sigmoidx'", "tanh"]),
    "activation case": c(PPO, "model.activation=Tanh", expect=["model.activation: unknown 'Tanh'", "did you mean"]),
    "sample_timeout negative": c(PPO, "rollout.sample_timeout_s=-1", expect="rollout.sample_timeout_s: -1.0"),
    "sample_timeout zero": c(PPO, "rollout.sample_timeout_s=0", expect="rollout.sample_timeout_s: 0.0"),
    "cpus per worker nan": c(PPO, "rollout.num_cpus_per_worker=nan",
                             expect="rollout.num_cpus_per_worker: nan must be a finite number"),
    "cpus per worker zero": c(PPO, "rollout=ray", "rollout.num_cpus_per_worker=0",
                              expect="rollout.num_cpus_per_worker: 0.0 must be positive"),
    "num_workers negative": c(PPO, "rollout.num_workers=-1", expect="rollout.num_workers: -1 must be >= 0"),
    "num_envs zero": c(PPO, "rollout.num_envs_per_worker=0", expect="rollout.num_envs_per_worker: 0"),
    "fragment zero": c(PPO, "rollout.rollout_fragment_length=0", expect="rollout.rollout_fragment_length: 0"),
    "both auto": c(PPO, "rollout.rollout_fragment_length=auto", expect=["both 'auto'"]),
    "restarts negative": c(PPO, "rollout.max_worker_restarts=-1", expect="rollout.max_worker_restarts: -1"),
    "server port out of range": c(PPO, "rollout=server", "rollout.server.port=70000",
                                  expect="rollout.server.port: 70000 must be between 0 and 65,535"),
    "server with a recurrent model": c(PPO, "rollout=server", "model=lstm",
                                       expect="model.name: rollout=server does not carry a recurrent model's state"),
    "start timeout negative": c(PPO, "rollout.ray.start_timeout_s=-5", expect="rollout.ray.start_timeout_s: -5.0"),
    "runtime_env unknown key": c(PPO, "rollout=ray", "rollout.num_workers=1",
                                 "rollout.ray.runtime_env={pyModules: [x]}",
                                 expect="rollout.ray.runtime_env: unknown key 'pyModules'"),
    "runtime_env module missing": c(PPO, "rollout=ray", "rollout.num_workers=1",
                                    "rollout.ray.runtime_env={py_modules: [no_such_pkg]}",
                                    expect=["rollout.ray.runtime_env.py_modules[0]", "no_such_pkg does not exist"]),
    "scheduling strategy unknown": c(PPO, "rollout=ray", "rollout.ray.scheduling_strategy=PACK",
                                     expect="rollout.ray.scheduling_strategy: 'PACK' is not one of"),
    "ray cpus and address": c(PPO, "rollout=ray", "rollout.ray.num_cpus=2", "rollout.ray.address=auto",
                              expect=["rollout.ray.num_cpus: 2", "rollout.ray.address='auto'"]),
    "batch_mode typo": c(PPO, "rollout.batch_mode=whole", expect=["rollout.batch_mode: 'whole'", "complete_episodes"]),
    "vectorize typo": c(PPO, "env.vectorize=fast", expect=["env.vectorize: 'fast'"]),
    "batch arithmetic": c(PPO, "rollout.num_envs_per_worker=16", "algo.train_batch_size=500",
                          expect=["algo.train_batch_size: 500", "32 x 16 x 1 = 512"]),
    "seed negative": c(PPO, "seed=-1", expect="seed: -1 must be between 0 and 2,147,483,647"),
    "seed 23 digits": c(PPO, "seed=12345678901234567890123", expect="seed: 12345678901234567890123"),
    "seed text": c(PPO, "seed=abc", expect=["seed", "'abc'"]),
    "torch_threads zero": c(PPO, "torch_threads=0", expect="torch_threads: 0 must be at least 1"),
    "min_time_s negative": c(PPO, "min_time_s_per_iteration=-0.5",
                             expect="min_time_s_per_iteration: -0.5 must be >= 0"),
    "min_time_s text": c(PPO, "min_time_s_per_iteration=soon", expect=["min_time_s_per_iteration", "'soon'"]),
    "matmul precision typo": c(PPO, "torch_matmul_precision=mediun",
                               expect=["torch_matmul_precision: unknown 'mediun'", "did you mean 'medium'"]),
    "matmul backend typo": c(PPO, "torch_matmul_backend=onedn",
                             expect=["torch_matmul_backend: unknown 'onedn'", "did you mean 'onednn'"]),
    "keep_last zero": c(PPO, "checkpoint.keep_last=0", expect="checkpoint.keep_last: 0 must be at least 1"),
    "every_n negative": c(PPO, "checkpoint.every_n_iters=-1", expect="checkpoint.every_n_iters: -1"),
    "eval interval negative": c(PPO, "evaluation.interval=-1", expect="evaluation.interval: -1"),
    "eval episodes zero": c(PPO, "evaluation.num_episodes=0", expect="evaluation.num_episodes: 0"),
    "eval envs zero": c(PPO, "evaluation.num_envs=0", expect="evaluation.num_envs: 0"),
    "log_model not bool": c(PPO, "tracking.log_model=2", expect=["tracking.log_model", "2"]),
    "empty output_dir": c(PPO, "output_dir=''", expect="output_dir: '' must not be empty"),
    "empty tracking uri": c(PPO, "tracking.tracking_uri=''", expect="tracking.tracking_uri: '' must not be empty"),
    "empty experiment name": c(PPO, "tracking.experiment_name=''",
                               expect="tracking.experiment_name: '' must not be empty"),
    "empty env id": c(PPO, "env.id=''", expect="env.id: '' must not be empty"),
    # ---------------------------------------------------------------- stop criteria
    "stop nan": c(PPO, "stop.timesteps_total=nan", expect="stop.timesteps_total: must be a finite number, got nan"),
    "stop inf": c(PPO, "stop.timesteps_total=inf", expect="stop.timesteps_total: must be a finite number, got inf"),
    "stop zero": c(PPO, "stop.timesteps_total=0", expect="stop.timesteps_total: must be positive"),
    "stop negative iterations": c(PPO, "stop.training_iteration=-1",
                                  expect="stop.training_iteration: must be positive"),
    "stop text": c(PPO, "stop.timesteps_total=abc", expect=["stop.timesteps_total", "'abc'"]),
    "stop metric nan": c("algo=ppo", "+stop.rollout.episode_return_mean=nan",
                         expect="stop.rollout/episode_return_mean: must be a finite number, got nan"),
    "stop metric typo": c(PPO, "+stop.rollout.episode_retrun_mean=400",
                          expect=["stop.rollout/episode_retrun_mean", "did you mean 'rollout/episode_return_mean'"]),
    "stop unknown key": c(PPO, "stop.timesteps=5000", expect=["stop.timesteps: unknown key", "timesteps_total"]),
    "no stop at all": c("stop.timesteps_total=null", expect="stop: no stop criterion"),
    "objective typo": c(PPO, "objective=rollout/episode_return", expect=["objective: 'rollout/episode_return'"]),
    # ---------------------------------------------------------------- DQN / APPO values
    "dqn replay zero": c(DQN, "algo.replay_capacity=0", expect="algo.replay_capacity: 0 must be at least 1"),
    "dqn n_step zero": c(DQN, "algo.n_step=0", expect="algo.n_step: 0 must be at least 1"),
    "dqn epsilon shape": c(DQN, "algo.epsilon=[[0]]", expect=["algo.epsilon: [[0.0]]", "[[env_step, value]"]),
    "dqn epsilon above 1": c(DQN, "algo.epsilon=[[0,1.5]]", expect=["algo.epsilon", "values must be in [0, 1]"]),
    "dqn epsilon order": c(DQN, "algo.epsilon=[[10,1],[5,0.1]]", expect=["algo.epsilon", "increase"]),
    "dqn learning_starts": c(DQN, "algo.learning_starts=-1", expect="algo.learning_starts: -1 must be >= 0"),
    "dqn target freq": c(DQN, "algo.target_network_update_freq=0", expect="algo.target_network_update_freq: 0"),
    "dqn intensity": c(DQN, "algo.training_intensity=0", expect="algo.training_intensity: 0.0 must be positive"),
    "dqn intensity schedule": c(DQN, "algo.training_intensity_schedule=[[0,32],[100,0]]",
                                expect=["algo.training_intensity_schedule", "values must be positive"]),
    "intensity ignored by schedule": c(DQN, "algo.training_intensity_schedule=[[0,16]]",
                                       expect=["algo.training_intensity: 32 has no effect", "starts at 16"]),
    "dqn huber": c(DQN, "loss.huber_delta=-1", expect="loss.huber_delta: -1.0 must be >= 0"),
    "dqn double_q": c(DQN, "algo.double_q=maybe", expect=["algo.double_q", "maybe"]),
    "appo rho": c("+experiment=appo_cartpole", "algo.vtrace_clip_rho=0", expect="algo.vtrace_clip_rho: 0.0"),
    "appo broadcast": c("+experiment=appo_cartpole", "algo.broadcast_interval=0", expect="algo.broadcast_interval: 0"),
    # ---------------------------------------------------------------- names
    "algo upper case": c("algo=PPO", expect=["algo: unknown config 'PPO'", "ppo"]),
    "algo typo": c("algo=ppoo", expect=["algo: unknown config 'ppoo'", "did you mean 'ppo'"]),
    "loss typo": c(PPO, "loss=ppoclip", expect=["loss: unknown config 'ppoclip'", "ppo_clip"]),
    "model typo": c(PPO, "model=mlpp", expect=["model: unknown config 'mlpp'", "mlp"]),
    "env group typo": c(PPO, "env=cartpol", expect=["env: unknown config 'cartpol'", "cartpole"]),
    "rollout typo": c(PPO, "rollout=rayy", expect=["rollout: unknown config 'rayy'", "ray"]),
    "experiment typo": c("+experiment=ppo_cartpol", expect=["experiment: unknown config 'ppo_cartpol'"]),
    "custom loss without name": c("algo=pg", "loss=custom", expect="loss.name: missing mandatory value"),
    "custom loss unknown": c("algo=pg", "loss=custom", "loss.name=vanila", expect=["loss.name: unknown loss 'vanila'"]),
    "custom model unknown": c(PPO, "model=custom", "model.name=resnet", expect=["model.name: unknown model 'resnet'"]),
    "env id typo": c(PPO, "env.id=CartPole-v9", expect=["env.id: unknown env 'CartPole-v9'", "CartPole-v1"]),
    "env id unknown": c(PPO, "env.id=NoSuchEnv", expect=["env.id: unknown env 'NoSuchEnv'"]),
    "loss for another algo": c(DQN, "loss=ppo_clip", expect=["loss.name: loss 'ppo_clip' needs batch columns"]),
    "optimizer typo": c(PPO, "algo.optimizer.name=Adamm", expect=["algo.optimizer.name: unknown optimizer 'Adamm'"]),
    "optimizer kwarg typo": c(PPO, "+algo.optimizer.kwargs.momentun=0.9",
                              expect=["algo.optimizer.kwargs.momentun", "'adam'"]),
    "optimizer lr kwarg": c(PPO, "+algo.optimizer.kwargs.lr=0.1", expect=["algo.optimizer.kwargs.lr", "algo.lr"]),
    "action dist typo": c(PPO, "model.action_dist=gaussian", expect=["model.action_dist: unknown action distribution"]),
    # ---------------------------------------------------------------- Hydra-level mistakes
    "experiment without plus": c("experiment=ppo_cartpole", expect=["experiment", "+experiment=<name>"]),
    "unknown key without plus": c(PPO, "env.kwargs.x=1", expect=["env.kwargs.x: unknown key", "+env.kwargs.x="]),
    "unknown algo key": c(PPO, "algo.lrr=1", expect=["algo.lrr: unknown key", "did you mean algo.lr?"]),
    "another algo's key": c(PPO, "algo.double_q=true", expect="algo.double_q: a key of algo dqn, not of algo ppo"),
    "unknown key with plus": c(PPO, "+algo.num_sgd_iters=3", expect=["algo.num_sgd_iters: unknown key",
                                                                    "num_sgd_iter"]),
    "grammar slash": c(PPO, "~stop.rollout/episode_return_mean", expect=["'~stop.rollout/episode_return_mean'",
                                                                         "override syntax"]),
    "grammar bracket": c(PPO, "algo.lr=[1,", expect=["'algo.lr=[1,'", "override syntax"]),
    "yaml error in config dir": c("--config-dir", "myconf", "algo=broken",
                                  files={"myconf/algo/broken.yaml": "name: ppo\nlr: [1, 2\n"},
                                  expect=["does not parse"]),
    "plugins not a list": c(PPO, "plugins=my_losses", expect=["plugins", "my_losses"]),
    # ---------------------------------------------------------------- plugins
    "plugin missing": c(PPO, "plugins=[nope_module]", expect="plugins[0]: cannot import module 'nope_module'"),
    "plugin empty name": c(PPO, "plugins=['']", expect="plugins[0]: '' is not a module name"),
    "plugin raises": c(PPO, "plugins=[bad_raise]", files={"bad_raise.py": "raise RuntimeError('boom')\n"},
                       expect=["plugins[0]: importing 'bad_raise' failed", "RuntimeError: boom", "line 1"]),
    "plugin syntax": c(PPO, "plugins=[bad_syntax]", files={"bad_syntax.py": "def f(:\n"},
                       expect=["plugins[0]: importing 'bad_syntax' failed: SyntaxError", "line 1"]),
    "plugin dependency": c(PPO, "plugins=[bad_dep]", files={"bad_dep.py": "import not_installed_pkg_xyz\n"},
                           expect="plugins[0]: module 'bad_dep' needs 'not_installed_pkg_xyz'"),
    "plugin duplicate name": c(PPO, "plugins=[dup]",
                               files={"dup.py": "from rlrun import LOSSES\nLOSSES.add('ppo_clip', print)\n"},
                               expect=["plugins[0]", "loss 'ppo_clip' is already registered"]),
    # ---------------------------------------------------------------- env API and user code contracts
    "env old api": c(PPO, "env.id=old_api", "plugins=[bad_envs]", files={"bad_envs.py": PLUGIN_ENVS},
                     expect=["env.id: old_api"]),
    "env wrong obs shape": c(PPO, "env.id=wrong_shape", "plugins=[bad_envs]", files={"bad_envs.py": PLUGIN_ENVS},
                             expect=["env.id: wrong_shape", "shape"]),
    "env vector reward": c(PPO, "env.id=vector_reward", "plugins=[bad_envs]", files={"bad_envs.py": PLUGIN_ENVS},
                           expect=["env.id: vector_reward"]),
    "env kwarg typo": c(PPO, "env.id=needs_size", "+env.kwargs.sise=3", "plugins=[bad_envs]",
                        files={"bad_envs.py": PLUGIN_ENVS}, expect=["env.kwargs: needs_size rejected", "sise"]),
    "gym env kwarg type": c(PPO, "+env.kwargs.max_episode_steps=abc",
                            expect=["env.id: CartPole-v1 (env.kwargs {'max_episode_steps': 'abc'})"]),
    "gym env kwarg unknown": c(PPO, "+env.kwargs.bogus=1", expect=["env.kwargs", "bogus"]),
    # (not with +experiment=ppo_cartpole: it sets model.hiddens, which a custom model does not have)
    "model wrong output": c("algo=ppo", "model=custom", "model.name=too_small", "plugins=[user_code]",
                            files={"user_code.py": PLUGIN_CODE}, expect=["model.name: model 'too_small' returned",
                                                                          "(1, 2)"]),
    "sac squashed gaussian on discrete": c("+experiment=sac_cartpole", "model.action_dist=squashed_gaussian",
                                           expect="model.action_dist: 'squashed_gaussian' cannot act in the env's "
                                                  "action space Discrete(2)"),
    "td3 on discrete": c("algo=td3", "loss=td3", "model=twin_q_mlp", "env=cartpole", "rollout=local",
                         "rollout.rollout_fragment_length=auto",
                         expect="algo.name: algo 'td3' needs a Box action space; the env's is Discrete(2)"),
    "pixel critics on vectors": c("algo=sac", "loss=sac", "model=twin_q_cnn", "env=pendulum", "rollout=local",
                                  "rollout.rollout_fragment_length=auto",
                                  expect="model.name: twin_q_cnn needs image observations ([H, W], [H, W, C], "
                                         "[C, H, W] or a frame stack), got shape (3,); use model=twin_q_mlp"),
    "pixel critics without units": c("+experiment=sac_minigrid_empty", "model.critic_hiddens=[]",
                                     expect="rlrun: error: model.critic_hiddens: every layer needs at least one unit, "
                                            "got []"),
    "replay of images too big": c("+experiment=dqn_breakout", "algo.replay_capacity=10000000",
                                  expect="rlrun: error: algo.replay_capacity: 10,000,000 rows of 4x84x84 uint8 "
                                         "observations (each row holds two) need at least 526 GiB; this machine has"),
    "no critics": c("+experiment=sac_pendulum", "model.num_critics=0",
                    expect="rlrun: error: model.num_critics: 0 must be at least 1"),
    "pixel filters shrink the image": c("+experiment=sac_minigrid_empty", "model.conv_filters=[[16,8,4]]",
                                        expect="model.conv_filters: [[16, 8, 4]] shrink the 7x7 image below 1x1"),
    "conv padding unknown": c("+experiment=ppo_minigrid_empty", "model.conv_padding=full",
                              expect="rlrun: error: model.conv_padding: 'full' is not one of"),
    "filters shrink the image before the last": c("+experiment=ppo_minigrid_empty", "model.conv_padding=same_but_last",
                                                  "model.conv_filters=[[8,3,2],[8,5,1]]",
                                                  expect="model.conv_filters: [[8, 3, 2], [8, 5, 1]] shrink the 4x4 "
                                                         "image below 1x1 at layer 1 (kernel 5, stride 1, padding "
                                                         "valid)"),
    "reward clip below zero": c(PPO, "algo.clip_rewards=-1",
                                expect="rlrun: error: algo.clip_rewards: -1.0 must be true, false or a positive bound"),
    "categorical on a box": c("+experiment=ppo_pendulum", "model.action_dist=categorical",
                              expect="model.action_dist: 'categorical' cannot act in the env's action space Box("),
    "loss not scalar": c("algo=pg", "loss=custom", "loss.name=per_row", "plugins=[user_code]",
                         "stop.training_iteration=1", files={"user_code.py": PLUGIN_CODE},
                         expect=["loss.name: loss 'per_row' returned a total of shape", "scalar"]),
    # ---------------------------------------------------------------- files and tracking stores
    "output dir unwritable": c(PPO, "output_dir=/proc/nope", expect="output_dir: cannot write to /proc/nope"),
    "sqlite store unwritable": c(PPO, "tracking.tracking_uri=sqlite:////proc/nope/x.db", tracked=True,
                                 expect="tracking.tracking_uri: cannot create the store's directory /proc/nope"),
    "server not listening": c(PPO, "tracking.tracking_uri=http://127.0.0.1:9", tracked=True,
                              expect="tracking.tracking_uri: no MLflow server answers at http://127.0.0.1:9"),
    "resume missing dir": c(PPO, "resume=/nonexistent/ck", expect="resume=/nonexistent/ck: not a checkpoint"),
    # rlrun rerun=<run id | run name | runs:/<id>>: a run of this store, found before anything runs
    "rerun no store": c(f"rerun={RUN_ID}", expect=[f"rerun={RUN_ID}: no MLflow store at", "mlflow.db"]),
    "rerun unknown id": c(f"rerun={RUN_ID}", files={"mlflow.db": ""},
                          expect=[f"rerun={RUN_ID}: no run {RUN_ID} in the tracking store", "tracking.tracking_uri"]),
    "rerun unknown name": c("rerun=ppo_cartpole-s0-beef", files={"mlflow.db": ""},
                            expect="rerun=ppo_cartpole-s0-beef: no run named 'ppo_cartpole-s0-beef'"),
    "rerun malformed uri": c("rerun=runs:/12ab", expect="rerun=runs:/12ab: not a run URI of the form runs:/<run id"),
    "rerun malformed spec": c("rerun=a;b", expect=["rerun='a;b'", "not a run id (32 hex digits)"]),
    "rerun with -m": c("-m", f"rerun={RUN_ID}", expect=[f"rerun={RUN_ID}: one run at a time"]),
    "resume latest none": c(PPO, "resume=latest", expect="resume=latest: no checkpoint of experiment"),
    "resume not a checkpoint": c(PPO, "resume=empty", files={"empty/readme.txt": "x"},
                                 expect="missing policy.pt"),
    "ckpt meta not utf8": c(PPO, "resume=ck", checkpoint="meta_not_utf8", expect=["ck/meta.json: not a JSON object"]),
    "ckpt meta a list": c(PPO, "resume=ck", checkpoint="meta_list", expect=["ck/meta.json: expected a JSON object"]),
    "ckpt meta old format": c(PPO, "resume=ck", checkpoint="meta_v1", expect=["format_version 1"]),
    "ckpt config bad yaml": c(PPO, "resume=ck", checkpoint="config_bad_yaml", expect=["ck/config.yaml: not a YAML"]),
    "ckpt truncated tensors": c(PPO, "resume=ck", checkpoint="truncated", expect=["ck/policy.pt: cannot be read"]),
    "ckpt pickled code": c(PPO, "resume=ck", checkpoint="pickled_code",
                           expect=["ck/policy.pt: refused to load", "need code to rebuild"]),
    "ckpt wrong shapes": c(PPO, "resume=ck", checkpoint="wrong_shapes", expect=["does not fit this config",
                                                                                "nothing was changed"]),
    "ckpt no counters": c(PPO, "resume=ck", checkpoint="no_counters", expect=["does not fit this config",
                                                                              "counters"]),
    "ckpt other algo": c(DQN, "resume=ck", checkpoint="as_is", expect=["resume: checkpoint", "algo.name"]),
    "ckpt history garbage": c(PPO, "resume=ck", checkpoint="history_garbage", expect=["history.jsonl", "line 1"]),
    # ---------------------------------------------------------------- with MLflow tracking: nothing left RUNNING
    "tracked lr": c(PPO, "algo.lr=-1", expect="algo.lr: -1.0 must be positive", tracked=True),
    "tracked plugin": c(PPO, "plugins=[nope_module]", expect="plugins[0]", tracked=True),
    "tracked env": c(PPO, "env.id=old_api", "plugins=[bad_envs]", files={"bad_envs.py": PLUGIN_ENVS},
                     expect=["env.id: old_api"], tracked=True),
    "tracked bad resume": c(PPO, "resume=ck", checkpoint="wrong_shapes", expect="does not fit", tracked=True),
}


def tamper(kind: str, src: Path, dst: Path) -> None:
    """A copy of the real checkpoint ``src`` at ``dst``, damaged the way ``kind`` says."""
    shutil.copytree(src, dst)
    if kind == "meta_not_utf8":
        (dst / "meta.json").write_bytes(b"\xff\xfe{not utf8")
    elif kind == "meta_list":
        (dst / "meta.json").write_text("[1, 2]")
    elif kind == "meta_v1":
        meta = json.loads((dst / "meta.json").read_text())
        meta["format_version"] = 1
        (dst / "meta.json").write_text(json.dumps(meta))
    elif kind == "config_bad_yaml":
        (dst / "config.yaml").write_text("algo: [unclosed\n")
    elif kind == "truncated":
        data = (dst / "policy.pt").read_bytes()
        (dst / "policy.pt").write_bytes(data[: len(data) // 3])
    elif kind == "pickled_code":
        import pickle

        class Evil:
            def __reduce__(self):
                return (print, ("pwned",))

        (dst / "policy.pt").write_bytes(pickle.dumps({"policies": Evil()}))
    elif kind in ("wrong_shapes", "no_counters"):
        state = torch.load(dst / "policy.pt", weights_only=True)
        if kind == "wrong_shapes":
            model = state["policies"]["default_policy"]["model"]
            key = next(iter(model))
            model[key] = torch.zeros(3, 3)
        else:
            del state["counters"]
        torch.save(state, dst / "policy.pt")
    elif kind == "history_garbage":
        (dst / "history.jsonl").write_text('{"not": "rows"}\n')


# run as real processes too: a few of each kind of refusal (tracked ones only as processes)
AS_PROCESS = {"lr negative", "train_batch_size huge", "hiddens huge", "workers past the cpus",
              "algo typo", "unknown algo key", "grammar bracket",
              "plugin syntax", "env old api", "output dir unwritable", "resume missing dir", "ckpt truncated tensors",
              "rerun unknown id",
              *(name for name, case in CASES.items() if case.tracked)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{case: {"in_process" and/or "process": (its result, its directory)}}"""
    base = tmp_path_factory.mktemp("bad_input")
    ck_run = cli_in_process([PPO, "tracking=none", "stop.training_iteration=1", "progress=false",
                             f"output_dir={base / 'good'}"], base)
    assert ck_run.returncode == 0, ck_run.stderr
    good = base / "good" / "checkpoints" / "iter_000001"

    def prepare(name: str, how: str) -> tuple[list[str], Path]:
        case = CASES[name]
        d = base / how / name.replace(" ", "_")
        d.mkdir(parents=True)
        for rel, text in case.files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        if case.checkpoint:
            tamper(case.checkpoint, good, d / "ck")
        return (case.args if case.tracked else [*case.args, "tracking=none"]), d

    environ = dict(os.environ)  # now: an in-process case changes os.environ while the processes start

    def as_process(name: str) -> tuple[str, subprocess.CompletedProcess[str], Path]:
        args, d = prepare(name, "process")
        return name, run_cli(args, d, timeout=300, base_env=environ), d

    out: dict[str, dict[str, tuple[Any, Path]]] = {name: {} for name in CASES}
    with ThreadPoolExecutor(max_workers=2) as pool:
        processes = pool.map(as_process, sorted(AS_PROCESS))
        for name, case in CASES.items():
            if not case.tracked:
                args, d = prepare(name, "in_process")
                out[name]["in_process"] = cli_in_process(args, d), d
        for name, p, d in processes:
            out[name]["process"] = p, d
    return out


@pytest.mark.parametrize("name", sorted(AS_PROCESS - {n for n, c in CASES.items() if c.tracked}))
def test_a_real_process_refuses_as_the_in_process_call_does(name, results):
    (inside, d_inside), (process, d_process) = results[name]["in_process"], results[name]["process"]
    assert (process.returncode, process.stderr.replace(str(d_process), "<dir>")) == \
        (inside.returncode, inside.stderr.replace(str(d_inside), "<dir>"))


def test_there_are_at_least_100_cases():
    assert len(CASES) >= 100


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_gets_one_clear_line(name, results):
    case = CASES[name]
    p, d = results[name].get("in_process") or results[name]["process"]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("rlrun: error: "), p.stderr[-3000:]
    for want in case.expect:
        assert want in lines[0], f"{want!r} not in: {lines[0]}"
    if case.tracked and (d / "mlflow.db").exists():
        with sqlite3.connect(d / "mlflow.db") as db:
            running = db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]
        assert running == 0
