"""A scripted vector env with gymnasium's next-step autoreset, for pinning down trajectory handling.

Sub-env i runs episodes of ``lengths[i]`` steps. obs = [i, t] (t = steps taken in the episode),
reward at step t = 1 + t, and the episode ends by termination or truncation per ``truncate[i]``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.models.base import ModelOutput


class ScriptedVectorEnv(gym.vector.VectorEnv):
    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, lengths: list[int], truncate: list[bool]) -> None:
        self.num_envs = num_envs
        self.lengths = np.array(lengths[:num_envs])
        self.truncate = np.array(truncate[:num_envs])
        self.single_observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.autoreset = np.zeros(num_envs, dtype=bool)
        self.dummy_steps = 0

    def _obs(self):
        return np.stack([np.arange(self.num_envs), self.t], axis=1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        self.t[:] = 0
        self.autoreset[:] = False
        return self._obs(), {}

    def step(self, actions):
        rew = (1.0 + self.t).astype(np.float32)
        self.t += 1
        done = self.t >= self.lengths
        term = done & ~self.truncate
        trunc = done & self.truncate
        # next-step autoreset: sub-envs that ended last step reset now, reward 0, not done
        r = self.autoreset
        self.dummy_steps += int(r.sum())
        self.t[r] = 0
        rew[r] = 0.0
        term[r] = False
        trunc[r] = False
        self.autoreset = term | trunc
        return self._obs(), rew, term, trunc, {}


class ValueIsTenT(nn.Module):
    """Uniform policy; V(obs) = 10 * t, so bootstrap values are easy to recognise."""

    def __init__(self, obs_space, action_space, num_outputs, config) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_outputs))

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        logits = self.bias.expand(obs.shape[0], -1)
        return ModelOutput(logits, 10.0 * obs[:, 1])
