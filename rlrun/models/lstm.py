"""``model: lstm``: an MLP, an LSTM, an optional MLP, then policy and value heads.

A recurrent model (``is_recurrent = True``) carries state between steps:

- ``initial_state(batch_size) -> list[Tensor [B, cell_size]]`` (h and c, twice when the value
  function has its own LSTM: ``vf_share_layers: false``);
- ``forward_step(obs [B, ...], state) -> (ModelOutput [B], new state)`` for acting;
- ``forward_seq(obs [S, L, ...], state at the sequence starts) -> (ModelOutput [S, L], final state)``
  for learning on sequences (rlrun/models/sequences.py cuts them; padding never reaches a loss);
- ``forward(obs)`` = one step from the initial state (what non-recurrent callers get).

Workers keep one state per sub-env, record it in ``state_in_<k>`` columns and reset it when an
episode starts; evaluation and ``rlrun-eval`` do the same. Observations are flattened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlrun.core.registry import MODELS
from rlrun.models.base import ACTIVATIONS, ModelConfig, ModelOutput, _init, _mlp


@dataclass
class LSTMConfig(ModelConfig):
    name: str = "lstm"
    hiddens: list[int] = field(default_factory=lambda: [64])  # MLP before the LSTM ([]: none)
    cell_size: int = 64
    post_hiddens: list[int] = field(default_factory=list)  # MLP after the LSTM, before the heads
    activation: str = "tanh"
    max_seq_len: int = 32  # training sequences are cut at this length (and at episode ends)
    vf_share_layers: bool = False  # False: the value function has its own MLP + LSTM (sb3-contrib's default)
    action_dist: str | None = None  # None: categorical for Discrete, diag_gaussian for Box
    free_log_std: bool = True
    init_log_std: float = 0.0


def check_lstm_config(c: LSTMConfig) -> str | None:
    if c.activation not in ACTIVATIONS:
        return f"activation: unknown '{c.activation}'; known: {', '.join(ACTIVATIONS)}"
    if c.max_seq_len <= 0:
        return f"max_seq_len: must be at least 1, got {c.max_seq_len}"
    if c.cell_size <= 0:
        return f"cell_size: must be at least 1, got {c.cell_size}"
    return None


class _Branch(nn.Module):
    """MLP -> LSTM -> MLP over ``[S, L, features]``."""

    def __init__(self, in_dim: int, c: LSTMConfig) -> None:
        super().__init__()
        act = ACTIVATIONS[c.activation]
        self.pre = _mlp([in_dim, *c.hiddens], act)
        self.lstm = nn.LSTM(c.hiddens[-1] if c.hiddens else in_dim, c.cell_size, batch_first=True)
        self.post = _mlp([c.cell_size, *c.post_hiddens], act)
        self.out_dim = c.post_hiddens[-1] if c.post_hiddens else c.cell_size

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
        y, (h1, c1) = self.lstm(self.pre(x), (h.unsqueeze(0), c.unsqueeze(0)))
        return self.post(y), h1.squeeze(0), c1.squeeze(0)


@MODELS.register("lstm", config=LSTMConfig, validate=check_lstm_config, recurrent=True)
class LSTMModel(nn.Module):
    """Recurrent actor-critic; see the module docstring for the interface."""

    is_recurrent = True

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: LSTMConfig) -> None:
        super().__init__()
        self.obs_dim = int(np.prod(obs_space.shape or (1,)))
        self.cell_size = config.cell_size
        self.max_seq_len = config.max_seq_len
        self.pi = _Branch(self.obs_dim, config)
        self.vf = None if config.vf_share_layers else _Branch(self.obs_dim, config)
        self.free_log_std = config.free_log_std and isinstance(action_space, gym.spaces.Box)
        head_out = num_outputs // 2 if self.free_log_std else num_outputs
        self.pi_head = _init(nn.Linear(self.pi.out_dim, head_out), 0.01)
        self.vf_head = _init(nn.Linear(self.pi.out_dim, 1), 1.0)
        if self.free_log_std:
            self.log_std = nn.Parameter(torch.full((head_out,), float(config.init_log_std)))

    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        n = 2 if self.vf is None else 4
        return [torch.zeros(batch_size, self.cell_size) for _ in range(n)]

    def forward_seq(self, obs: torch.Tensor, state: Sequence[torch.Tensor]) -> tuple[ModelOutput, list[torch.Tensor]]:
        s, length = obs.shape[0], obs.shape[1]
        x = obs.reshape(s, length, -1).float()
        y, h, c = self.pi(x, state[0], state[1])
        new_state = [h, c]
        logits = F.linear(y, self.pi_head.weight, self.pi_head.bias)
        if self.free_log_std:
            logits = torch.cat([logits, self.log_std.expand_as(logits)], dim=-1)
        if self.vf is not None:
            y, hv, cv = self.vf(x, state[2], state[3])
            new_state += [hv, cv]
        return ModelOutput(logits, self.vf_head(y).squeeze(-1)), new_state

    def forward_step(self, obs: torch.Tensor, state: Sequence[torch.Tensor]) -> tuple[ModelOutput, list[torch.Tensor]]:
        out, new_state = self.forward_seq(obs.unsqueeze(1), state)
        return ModelOutput(out.dist_inputs[:, 0], out.values[:, 0]), new_state

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        return self.forward_step(obs, self.initial_state(obs.shape[0]))[0]
