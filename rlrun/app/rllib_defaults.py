"""RLlib's classic defaults, which apply to the keys an RLlib experiment leaves unset (``rllib_files.translate``),
the defaults of RLlib's vision net and Atari preprocessing (``rllib_images``), its retired env ids and stop keys."""

from __future__ import annotations

from typing import Any

# RLlib's classic defaults (Ray 2.2-2.9, resolved from its AlgorithmConfig classes; RLlib key -> value),
# common then per run
RLLIB_DEFAULTS: dict[str, dict[str, Any]] = {
    "common": {"gamma": 0.99, "lr": 0.001, "train_batch_size": 32, "num_workers": 0, "num_envs_per_worker": 1,
               "rollout_fragment_length": 200, "grad_clip": None, "observation_filter": "NoFilter",
               "model": {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh", "vf_share_layers": True,
                         "free_log_std": False}},
    "PG": {"lr": 0.0004, "rollout_fragment_length": "auto", "train_batch_size": 200, "num_workers": 0},
    "A2C": {"lr": 0.0001, "grad_clip": 40.0, "lambda": 1.0, "vf_loss_coeff": 0.5, "entropy_coeff": 0.01,
            "rollout_fragment_length": "auto", "num_workers": 2, "min_time_s_per_iteration": 10},
    "PPO": {"lr": 5e-5, "train_batch_size": 4000, "sgd_minibatch_size": 128, "num_sgd_iter": 30, "lambda": 1.0,
            "kl_coeff": 0.2, "kl_target": 0.01, "vf_loss_coeff": 1.0, "entropy_coeff": 0.0, "clip_param": 0.3,
            "vf_clip_param": 10.0, "rollout_fragment_length": "auto", "num_workers": 2,
            "model": {"vf_share_layers": False}},
    "APPO": {"lr": 0.0005, "train_batch_size": 500, "rollout_fragment_length": 50, "num_sgd_iter": 1,
             "lambda": 1.0, "clip_param": 0.4, "vf_loss_coeff": 0.5, "entropy_coeff": 0.01, "grad_clip": 40.0,
             "num_workers": 2, "vtrace": True, "min_time_s_per_iteration": 10},
    "DQN": {"lr": 0.0005, "train_batch_size": 32, "rollout_fragment_length": "auto", "n_step": 1, "double_q": True,
            "dueling": True, "hiddens": [256], "target_network_update_freq": 500, "grad_clip": 40.0,
            "num_steps_sampled_before_learning_starts": 1000, "min_sample_timesteps_per_iteration": 1000,
            "replay_buffer_config": {"type": "MultiAgentPrioritizedReplayBuffer", "capacity": 50000,
                                     "prioritized_replay_alpha": 0.6, "prioritized_replay_beta": 0.4,
                                     "prioritized_replay_eps": 1e-6},
            "exploration_config": {"initial_epsilon": 1.0, "final_epsilon": 0.02, "epsilon_timesteps": 10000}},
    "SAC": {"train_batch_size": 256, "rollout_fragment_length": "auto", "tau": 0.005, "initial_alpha": 1.0,
            "n_step": 1, "num_steps_sampled_before_learning_starts": 1500, "min_sample_timesteps_per_iteration": 100,
            "min_time_s_per_iteration": 1, "replay_buffer_config": {"capacity": 1000000},
            "optimization": {"actor_learning_rate": 0.0003, "critic_learning_rate": 0.0003,
                             "entropy_learning_rate": 0.0003},
            "q_model_config": {"fcnet_hiddens": [256, 256], "fcnet_activation": "relu"},
            "policy_model_config": {"fcnet_hiddens": [256, 256], "fcnet_activation": "relu"}},
    "TD3": {"train_batch_size": 100, "twin_q": True, "smooth_target_policy": True,
            "actor_hidden_activation": "relu", "rollout_fragment_length": "auto", "tau": 0.005, "actor_lr": 0.001,
            "critic_lr": 0.001, "actor_hiddens": [400, 300], "critic_hiddens": [400, 300], "policy_delay": 2,
            "target_noise": 0.2, "target_noise_clip": 0.5, "num_steps_sampled_before_learning_starts": 10000,
            "min_sample_timesteps_per_iteration": 1000, "replay_buffer_config": {"capacity": 1000000},
            "exploration_config": {"random_timesteps": 10000, "stddev": 0.1}},
    "DDPG": {"train_batch_size": 256, "twin_q": False, "smooth_target_policy": False, "policy_delay": 1,
             "actor_hidden_activation": "relu", "rollout_fragment_length": "auto", "tau": 0.002, "actor_lr": 0.001,
             "critic_lr": 0.001, "actor_hiddens": [400, 300], "critic_hiddens": [400, 300],
             "num_steps_sampled_before_learning_starts": 1500, "min_sample_timesteps_per_iteration": 1000,
             "replay_buffer_config": {"capacity": 50000}, "l2_reg": 1e-6, "use_huber": False,
             "exploration_config": {"type": "OrnsteinUhlenbeckNoise", "random_timesteps": 1000, "ou_base_scale": 0.1,
                                    "ou_theta": 0.15, "ou_sigma": 0.2}},
    "BC": {"lr": 0.0001, "train_batch_size": 2000, "beta": 0.0},
    "MARWIL": {"lr": 0.0001, "train_batch_size": 2000, "beta": 1.0, "vf_coeff": 1.0},
}
RLLIB_DEFAULTS["A3C"] = {**RLLIB_DEFAULTS["A2C"], "rollout_fragment_length": 10, "min_time_s_per_iteration": 5}

# RLlib's model-dict defaults for image observations (``MODEL_DEFAULTS``): the frame size and stacking of its
# DeepMind preprocessing (``preprocessor_pref: deepmind``), and its vision net's layers after the convolutions
VISION_DEFAULTS: dict[str, Any] = {"dim": 84, "framestack": True, "conv_activation": "relu", "post_fcnet_hiddens": [],
                                   "post_fcnet_activation": "relu"}
# RLlib's default conv_filters by frame size (``get_filter_config``), [out_channels, kernel, stride] per layer,
# every layer "same"-padded but the last
VISION_FILTERS: dict[int, list[list[int]]] = {96: [[16, 8, 4], [32, 4, 2], [256, 11, 2]],
                                              84: [[16, 8, 4], [32, 4, 2], [256, 11, 1]],
                                              42: [[16, 4, 2], [32, 4, 2], [256, 11, 1]],
                                              10: [[16, 5, 2], [32, 5, 2]]}

# the gym era's env ids that gymnasium retired -> their successors
ENV_SUCCESSORS = {"CartPole-v0": "CartPole-v1", "Pendulum-v0": "Pendulum-v1", "MountainCar-v0": "MountainCar-v0",
                  "Acrobot-v0": "Acrobot-v1", "LunarLander-v2": "LunarLander-v3", "LunarLanderContinuous-v2":
                  "LunarLanderContinuous-v3", "MountainCarContinuous-v0": "MountainCarContinuous-v0",
                  "HalfCheetah-v2": "HalfCheetah-v5", "HalfCheetah-v3": "HalfCheetah-v5", "Hopper-v2": "Hopper-v5",
                  "Hopper-v3": "Hopper-v5", "InvertedPendulum-v2": "InvertedPendulum-v5"}
# RLlib stop keys -> rlrun's
STOP_KEYS = {"episode_reward_mean": "rollout/episode_return_mean",
             "sampler_results/episode_reward_mean": "rollout/episode_return_mean",
             "env_runners/episode_return_mean": "rollout/episode_return_mean",
             "evaluation/episode_reward_mean": "eval/episode_return_mean",
             "evaluation/sampler_results/episode_reward_mean": "eval/episode_return_mean",
             "evaluation/env_runners/episode_return_mean": "eval/episode_return_mean",
             "timesteps_total": "timesteps_total", "num_env_steps_sampled": "timesteps_total",
             "training_iteration": "training_iteration", "time_total_s": "time_total_s",
             "episodes_total": "episodes_total"}
