"""Actor and Q-critics for SAC, TD3 and DDPG: ``twin_q_mlp``.

``forward(obs)`` is the actor: its outputs are the action distribution's inputs (a squashed Gaussian's
means and log-stds for SAC, a deterministic policy's pre-tanh actions for TD3), so acting, evaluation
and exports use it like any model. ``q(obs, actions)`` gives every critic's Q-values ``[C, B]`` for
actions in [-1, 1] (``to_unit`` maps the env's bounds there).

On a Discrete action space (SAC only, as RLlib's SAC) the model is a ``DiscreteTwinQModel``: the actor's
outputs are the categorical's logits, each critic maps an observation to one Q-value per action
(``q_all(obs)`` ``[C, B, n]``), and ``q(obs, actions)`` picks the taken actions' values.

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
    # None: squashed_gaussian on a Box (SAC), categorical on a Discrete; deterministic: TD3, DDPG
    action_dist: str | None = None


def check_critics(c: TwinQConfig | object) -> str | None:
    """``num_critics`` and ``critic_hiddens`` (``twin_q_mlp``'s and ``twin_q_cnn``'s): ``key: message`` below
    ``model``."""
    num, hiddens = getattr(c, "num_critics", 1), list(getattr(c, "critic_hiddens", []))
    if num < 1:
        return f"num_critics: must be at least 1, got {num}"
    if not hiddens or any(h < 1 for h in hiddens):
        return f"critic_hiddens: every layer needs at least one unit, got {hiddens}"
    return None


def check_twin_q_config(c: TwinQConfig) -> str | None:
    return check_critics(c) or check_mlp_config(c)


class CriticStack(nn.Module):
    """``num`` MLPs ``in -> hiddens -> outputs`` with their weights stacked: one ``baddbmm`` per hidden
    layer for all of them. An output layer of one unit is a multiply and a sum: ``baddbmm`` with one
    output column took 142 us here against 24 us (a 256-row minibatch, 256 units, two critics); of more
    units (a Discrete space's Q-value per action) a ``baddbmm``."""

    def __init__(self, num: int, sizes: list[int], act: str, outputs: int = 1) -> None:
        super().__init__()
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(a)  # nn.Linear's default initialisation, per critic
            self.weights.append(nn.Parameter(torch.empty(num, a, b).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num, 1, b).uniform_(-bound, bound)))
        bound = 1.0 / math.sqrt(sizes[-1])
        if outputs == 1:
            self.out_weight = nn.Parameter(torch.empty(num, 1, sizes[-1]).uniform_(-bound, bound))
            self.out_bias = nn.Parameter(torch.empty(num, 1).uniform_(-bound, bound))
        else:  # [num, hidden, outputs] and [num, 1, outputs], as the hidden layers
            self.out_weight = nn.Parameter(torch.empty(num, sizes[-1], outputs).uniform_(-bound, bound))
            self.out_bias = nn.Parameter(torch.empty(num, 1, outputs).uniform_(-bound, bound))
        self.num = num
        self.outputs = outputs
        self._act = _ACT_FNS[act]

    def forward(self, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``x`` [B, in] -> [num, B] (one output) or [num, B, outputs]. ``detach``: the weights as constants
        (gradients reach ``x`` only)."""
        h = x.unsqueeze(0).expand(self.num, *x.shape)
        for w, b in zip(self.weights, self.biases, strict=True):
            if detach:
                w, b = w.detach(), b.detach()
            h = self._act(torch.baddbmm(b, h, w))
        w_out: torch.Tensor = self.out_weight
        b_out: torch.Tensor = self.out_bias
        if detach:
            w_out, b_out = w_out.detach(), b_out.detach()
        if self.outputs > 1:
            return torch.baddbmm(b_out, h, w_out)
        return (h * w_out).sum(-1) + b_out

    def weight_of(self, critic: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Critic ``critic``'s layers as (weight [in, out], bias [out]) pairs, the output layer last."""
        layers = [(w[critic], b[critic, 0]) for w, b in zip(self.weights, self.biases, strict=True)]
        if self.outputs > 1:
            return [*layers, (self.out_weight[critic], self.out_bias[critic, 0])]
        return [*layers, (self.out_weight[critic].T, self.out_bias[critic])]


class ActorCriticGroups(nn.Module):
    """The parameter groups SAC and TD3 give their own optimizers: the actor (``actor`` and ``head``) and the
    critics (``critics``); TD3's target actor is the same two modules (``twin_q_mlp``, ``twin_q_cnn``)."""

    actor: nn.Module
    head: nn.Module
    critics: nn.Module

    def actor_parameters(self) -> list[nn.Parameter]:
        return [*self.actor.parameters(), *self.head.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.critics.parameters())


class ActorAndCritics(ActorCriticGroups):
    """What both kinds of ``twin_q_mlp`` share: an MLP actor whose head gives the action distribution's inputs,
    and a ``CriticStack`` (built by the subclass, after the actor: the draws of the initialisation in that order)."""

    head: nn.Linear
    critics: CriticStack

    def __init__(self, obs_dim: int, num_outputs: int, config: TwinQConfig) -> None:
        super().__init__()
        sizes = [obs_dim, *config.hiddens]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), ACTIVATIONS[config.activation]()]
        self.actor = nn.Sequential(*layers)
        self.head = nn.Linear(sizes[-1], num_outputs)
        self._act = _ACT_FNS[config.activation]
        self._layers = linear_layers(self.actor)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        h = mlp_forward(self._layers, self._act, obs.reshape(obs.shape[0], -1).float())
        out = self.head(h)
        return ModelOutput(out, torch.zeros(out.shape[0]))


class BoxActions(nn.Module):
    """The Box case's action maps: the env's bounds <-> [-1, 1], where the critics take actions."""

    action_mid: torch.Tensor  # buffers: the action space's centre and half-width per dimension
    action_half: torch.Tensor

    def _register_bounds(self, action_space: gym.spaces.Box, name: str) -> None:
        low, high = (np.broadcast_to(x, action_space.shape).reshape(-1).astype(np.float32)
                     for x in (action_space.low, action_space.high))
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(f"{name} needs finite action bounds, got low={low.tolist()}, high={high.tolist()}")
        self.register_buffer("action_mid", torch.as_tensor((high + low) / 2))
        self.register_buffer("action_half", torch.as_tensor((high - low) / 2))

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        """Env-scale actions -> [-1, 1]."""
        return (actions.reshape(actions.shape[0], -1).float() - self.action_mid) / self.action_half

    def to_env(self, unit: np.ndarray) -> np.ndarray:
        """[-1, 1] -> the env's bounds (numpy, for acting)."""
        return (self.action_mid.numpy() + self.action_half.numpy() * unit).astype(np.float32)


class DiscreteActions(nn.Module):
    """The Discrete case: ``q`` picks the taken actions' values from ``q_all``; actions stay indices."""

    def q_all(self, obs: torch.Tensor, detach: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def q(self, obs: torch.Tensor, actions: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """Every critic's Q(obs, actions) ``[C, B]`` for action indices ``[B]``."""
        q = self.q_all(obs, detach)
        return q.gather(2, actions.long().reshape(1, -1, 1).expand(q.shape[0], -1, 1)).squeeze(2)

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        """Action indices as they are (the Box model's map to [-1, 1] has no Discrete counterpart)."""
        return actions.reshape(actions.shape[0]).long()

    def to_env(self, unit: np.ndarray) -> np.ndarray:
        return np.asarray(unit, dtype=np.int64)


class TwinQModel(ActorAndCritics, BoxActions):
    """``twin_q_mlp`` on a Box action space: critics over (observation, action in [-1, 1])."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: TwinQConfig) -> None:
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"twin_q_mlp needs a Box or Discrete action space, got {action_space}")
        obs_dim = int(np.prod(obs_space.shape or (1,)))
        super().__init__(obs_dim, num_outputs, config)
        act_dim = int(np.prod(action_space.shape))
        self.critics = CriticStack(config.num_critics, [obs_dim + act_dim, *config.critic_hiddens], config.activation)
        self._register_bounds(action_space, "twin_q_mlp")

    def q(self, obs: torch.Tensor, actions: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """Every critic's Q(obs, actions) ``[C, B]``; ``actions`` in [-1, 1] (``to_unit``)."""
        x = torch.cat([obs.reshape(obs.shape[0], -1).float(), actions.reshape(actions.shape[0], -1)], dim=-1)
        return self.critics(x, detach)


class DiscreteTwinQModel(ActorAndCritics, DiscreteActions):
    """``twin_q_mlp`` on a Discrete action space: the actor's logits, critics of one Q-value per action."""

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Discrete, num_outputs: int,
                 config: TwinQConfig) -> None:
        obs_dim = int(np.prod(obs_space.shape or (1,)))
        super().__init__(obs_dim, num_outputs, config)
        self.critics = CriticStack(config.num_critics, [obs_dim, *config.critic_hiddens], config.activation,
                                   int(action_space.n))

    def q_all(self, obs: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """Every critic's Q-value of every action ``[C, B, n]``."""
        return self.critics(obs.reshape(obs.shape[0], -1).float(), detach)


# model.action_dist: null resolves to action_dists' entry for the space (distributions.model_distribution)
@MODELS.register("twin_q_mlp", config=TwinQConfig, validate=check_twin_q_config,
                 action_dists={gym.spaces.Box: "squashed_gaussian", gym.spaces.Discrete: "categorical"})
def twin_q_mlp(obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: TwinQConfig) -> nn.Module:
    """A ``TwinQModel`` for a Box action space, a ``DiscreteTwinQModel`` for a Discrete one."""
    if isinstance(action_space, gym.spaces.Discrete):
        return DiscreteTwinQModel(obs_space, action_space, num_outputs, config)
    return TwinQModel(obs_space, action_space, num_outputs, config)
