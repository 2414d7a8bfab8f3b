"""Models: torch modules mapping observations to action-distribution inputs and value estimates.

A MODELS entry is a class ``(obs_space, action_space, num_outputs, config) -> nn.Module`` whose
``forward(obs [B, *obs_shape]) -> ModelOutput(dist_inputs [B, num_outputs], values [B])``.
One call serves acting and learning, so a vector step costs one forward pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlrun.config.schemas import ModelConfig
from rlrun.core.errors import suggest
from rlrun.core.registry import MODELS


class ModelOutput(NamedTuple):
    dist_inputs: torch.Tensor  # [B, num_outputs]
    values: torch.Tensor  # [B]


# "linear": no activation (RLlib's fcnet_activation: linear, a linear model)
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU, "linear": nn.Identity,
}
_ACT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh, "relu": torch.relu, "elu": F.elu, "gelu": F.gelu, "silu": F.silu, "linear": lambda x: x,
}


@dataclass
class MLPConfig(ModelConfig):
    name: str = "mlp"
    hiddens: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    vf_share_layers: bool = False  # one torso for policy and value, or two separate MLPs
    # Gaussian policies: a state-independent learned log-std (True) or one output per action (False)
    free_log_std: bool = True
    init_log_std: float = 0.0
    action_dist: str | None = None  # None: categorical for Discrete, diag_gaussian for Box


def _mlp(sizes: list[int], act: type[nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [_init(nn.Linear(a, b), np.sqrt(2)), act()]
    return nn.Sequential(*layers)


def linear_layers(seq: nn.Sequential) -> list[nn.Linear]:
    return [m for m in seq if isinstance(m, nn.Linear)]


def mlp_forward(layers: list[nn.Linear], act: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``act(linear(x))`` through ``layers``, calling them functionally: nn.Module.__call__ costs more
    than a 64-wide layer at acting batch sizes (one vector step = one forward pass)."""
    for layer in layers:
        x = act(F.linear(x, layer.weight, layer.bias))
    return x


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    # orthogonal init with small policy-head gain (Andrychowicz et al. 2021, "What matters in on-policy RL")
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def check_mlp_config(c: MLPConfig) -> str | None:
    """What is wrong with an MLP config (``key: message`` below ``model``), checked before compute."""
    if c.activation not in ACTIVATIONS:
        return f"activation: unknown '{c.activation}'{suggest(c.activation, list(ACTIVATIONS))}; known: " \
               f"{', '.join(ACTIVATIONS)}"
    return None


@MODELS.register("mlp", config=MLPConfig, validate=check_mlp_config)
class MLPModel(nn.Module):
    """Fully connected actor-critic with a shared or a separate value network."""

    def __init__(
        self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: MLPConfig
    ) -> None:
        super().__init__()
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"model.activation: unknown '{config.activation}', known: {list(ACTIVATIONS)}")
        act = ACTIVATIONS[config.activation]
        in_dim = int(np.prod(obs_space.shape or (1,)))
        sizes = [in_dim, *config.hiddens]
        self.free_log_std = config.free_log_std and isinstance(action_space, gym.spaces.Box)
        head_out = num_outputs // 2 if self.free_log_std else num_outputs
        self.torso = _mlp(sizes, act)
        self.vf_torso = None if config.vf_share_layers else _mlp(sizes, act)
        self.pi_head = _init(nn.Linear(sizes[-1], head_out), 0.01)
        self.vf_head = _init(nn.Linear(sizes[-1], 1), 1.0)
        if self.free_log_std:
            self.log_std = nn.Parameter(torch.full((head_out,), float(config.init_log_std)))
        self._act = _ACT_FNS[config.activation]
        self._pi_layers = linear_layers(self.torso)
        self._vf_layers = None if self.vf_torso is None else linear_layers(self.vf_torso)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        x = obs.reshape(obs.shape[0], -1).float()
        h = mlp_forward(self._pi_layers, self._act, x)
        logits = F.linear(h, self.pi_head.weight, self.pi_head.bias)
        if self.free_log_std:
            logits = torch.cat([logits, self.log_std.expand_as(logits)], dim=-1)
        hv = h if self._vf_layers is None else mlp_forward(self._vf_layers, self._act, x)
        return ModelOutput(logits, F.linear(hv, self.vf_head.weight, self.vf_head.bias).squeeze(-1))
