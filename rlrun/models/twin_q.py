"""Actor and Q-critics for continuous control (SAC, TD3, DDPG): ``twin_q_mlp``.

``forward(obs)`` is the actor: its outputs are the action distribution's inputs (a squashed Gaussian's
means and log-stds for SAC, a deterministic policy's pre-tanh actions for TD3), so acting, evaluation
and exports use it like any model. ``q(obs, actions)`` gives every critic's Q-values ``[C, B]`` for
actions in [-1, 1] (``to_unit`` maps the env's bounds there).

The ``num_critics`` critics are one stack of weights ``[C, in, out]`` per layer: one batched matmul
(``torch.baddbmm``) per layer evaluates all of them, instead of one small matmul per critic.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.core.registry import MODELS
from rlrun.models.base import (
    _ACT_FNS,
    ACTIVATIONS,
    MLPConfig,
    ModelOutput,
    check_mlp_config,
    linear_layers,
    mlp_forward,
)


@dataclass
class TwinQConfig(MLPConfig):
    name: str = "twin_q_mlp"
    hiddens: list[int] = field(default_factory=lambda: [256, 256])  # the actor's
    critic_hiddens: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    num_critics: int = 2  # 2: clipped double Q (SAC, TD3); 1: DDPG
    free_log_std: bool = False  # unused: a squashed Gaussian's log-std is an actor output
    action_dist: str | None = "squashed_gaussian"  # squashed_gaussian (SAC) | deterministic (TD3, DDPG)


def check_twin_q_config(c: TwinQConfig) -> str | None:
    if c.num_critics < 1:
        return f"model.num_critics: must be at least 1, got {c.num_critics}"
    if not c.critic_hiddens or any(h < 1 for h in c.critic_hiddens):
        return f"model.critic_hiddens: every layer needs at least one unit, got {list(c.critic_hiddens)}"
    return check_mlp_config(c)


class CriticStack(nn.Module):
    """``num`` MLPs ``in -> hiddens -> 1`` with their weights stacked: one ``baddbmm`` per hidden
    layer for all of them. The output layer (one unit) is a multiply and a sum: ``baddbmm`` with one
    output column took 142 us here against 24 us (a 256-row minibatch, 256 units, two critics)."""

    def __init__(self, num: int, sizes: list[int], act: str) -> None:
        super().__init__()
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(a)  # nn.Linear's default initialisation, per critic
            self.weights.append(nn.Parameter(torch.empty(num, a, b).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num, 1, b).uniform_(-bound, bound)))
        bound = 1.0 / math.sqrt(sizes[-1])
        self.out_weight = nn.Parameter(torch.empty(num, 1, sizes[-1]).uniform_(-bound, bound))
        self.out_bias = nn.Parameter(torch.empty(num, 1).uniform_(-bound, bound))
        self.num = num
        self._act = _ACT_FNS[act]

    def forward(self, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``x`` [B, in] -> [num, B]. ``detach``: the weights as constants (gradients reach ``x`` only)."""
        h = x.unsqueeze(0).expand(self.num, *x.shape)
        for w, b in zip(self.weights, self.biases, strict=True):
            if detach:
                w, b = w.detach(), b.detach()
            h = self._act(torch.baddbmm(b, h, w))
        w_out: torch.Tensor = self.out_weight
        b_out: torch.Tensor = self.out_bias
        if detach:
            w_out, b_out = w_out.detach(), b_out.detach()
        return (h * w_out).sum(-1) + b_out

    def weight_of(self, critic: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Critic ``critic``'s layers as (weight [in, out], bias [out]) pairs, the output layer last."""
        layers = [(w[critic], b[critic, 0]) for w, b in zip(self.weights, self.biases, strict=True)]
        return [*layers, (self.out_weight[critic].T, self.out_bias[critic])]


@MODELS.register("twin_q_mlp", config=TwinQConfig, validate=check_twin_q_config)
class TwinQModel(nn.Module):
    action_mid: torch.Tensor  # buffers: the action space's centre and half-width per dimension
    action_half: torch.Tensor

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: TwinQConfig) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"twin_q_mlp needs a Box action space, got {action_space}")
        obs_dim = int(np.prod(obs_space.shape or (1,)))
        act_dim = int(np.prod(action_space.shape))
        sizes = [obs_dim, *config.hiddens]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), ACTIVATIONS[config.activation]()]
        self.actor = nn.Sequential(*layers)
        self.head = nn.Linear(sizes[-1], num_outputs)
        self.critics = CriticStack(config.num_critics, [obs_dim + act_dim, *config.critic_hiddens], config.activation)
        low, high = (np.broadcast_to(x, action_space.shape).reshape(-1).astype(np.float32)
                     for x in (action_space.low, action_space.high))
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"twin_q_mlp needs finite action bounds, got low={low.tolist()}, high={high.tolist()}")
        self.register_buffer("action_mid", torch.as_tensor((high + low) / 2))
        self.register_buffer("action_half", torch.as_tensor((high - low) / 2))
        self._act = _ACT_FNS[config.activation]
        self._layers = linear_layers(self.actor)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        h = mlp_forward(self._layers, self._act, obs.reshape(obs.shape[0], -1).float())
        out = self.head(h)
        return ModelOutput(out, torch.zeros(out.shape[0]))

    def q(self, obs: torch.Tensor, actions: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """Every critic's Q(obs, actions) ``[C, B]``; ``actions`` in [-1, 1] (``to_unit``)."""
        x = torch.cat([obs.reshape(obs.shape[0], -1).float(), actions.reshape(actions.shape[0], -1)], dim=-1)
        return self.critics(x, detach)

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        """Env-scale actions -> [-1, 1]."""
        return (actions.reshape(actions.shape[0], -1).float() - self.action_mid) / self.action_half

    def to_env(self, unit: np.ndarray) -> np.ndarray:
        """[-1, 1] -> the env's bounds (numpy, for acting)."""
        return (self.action_mid.numpy() + self.action_half.numpy() * unit).astype(np.float32)

    def actor_parameters(self) -> list[nn.Parameter]:
        return [*self.actor.parameters(), *self.head.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.critics.parameters())
