"""Checking a model against its spaces before anything trains: one forward pass on a sample
observation, and one line (exit 2) naming the model and the shapes when it does not fit."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.config.schemas import ModelConfig
from rlrun.core.errors import PluginError, first_line
from rlrun.core.registry import DISTRIBUTIONS
from rlrun.models.action_mask import build_model
from rlrun.models.distributions import model_distribution


def check_model_fits(model_cfg: ModelConfig, obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
    """Build the configured model once for these spaces and check its output, before a run starts:
    a model config that cannot fit the observations (conv_filters shrinking the image away) or a
    plugin model returning the wrong shapes fails here with one line."""
    dist_name = model_distribution(model_cfg, action_space)
    try:
        num_outputs = DISTRIBUTIONS.get(dist_name, "model.action_dist").required_inputs(action_space)
    except (AssertionError, ValueError, TypeError):  # a distribution for another kind of action space
        raise PluginError(f"model.action_dist: '{dist_name}' cannot act in the env's action space {action_space}"
                          ) from None
    model = build_model(model_cfg.name, obs_space, action_space, num_outputs, model_cfg)
    check_model_output(model, obs_space, model_cfg.name, num_outputs)
    return model


def check_model_output(model: nn.Module, obs_space: gym.Space, name: str, num_outputs: int) -> None:
    """One forward pass on a sample observation: the model must return ModelOutput(dist_inputs [B,
    num_outputs], values [B]) - else one line naming the model and the shapes, before training."""
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(np.asarray(obs_space.sample())[None]))
        dist_shape, value_shape = tuple(out.dist_inputs.shape), tuple(out.values.shape)
    except Exception as e:
        raise PluginError(f"model.name: model '{name}' failed on a sample observation: {type(e).__name__}: "
                          f"{first_line(e, '')}") from None
    if dist_shape != (1, num_outputs) or value_shape != (1,):
        raise PluginError(f"model.name: model '{name}' returned dist_inputs of shape {dist_shape} and values of "
                          f"shape {value_shape} for one observation; the action distribution needs (1, {num_outputs}) "
                          "and (1,)")
