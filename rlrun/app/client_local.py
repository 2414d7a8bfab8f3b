"""Local inference for ``PolicyClient(..., inference="local")``: the run's policy, rebuilt in the
client's process from the server's config and weights. Imports torch and rlrun's policy code, so only
local mode loads it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from rlrun.data.spaces import space_from_json
from rlrun.policy.policy import DEFAULT_POLICY_ID
from rlrun.sources.plugins import load_builtins
from rlrun.sources.serving.local import act_one
from rlrun.sources.serving.wire import decode_array
from rlrun.sources.worker_base import make_policy_factory
from rlrun.training.validate import build_config


class LocalPolicy:
    def __init__(self, info: dict[str, Any], payload: dict[str, Any]) -> None:
        torch.set_num_threads(1)  # small models, one step at a time: threads only add overhead
        self.obs_space = space_from_json(info["observation_space"])
        self.action_space = space_from_json(info["action_space"])
        load_builtins()  # the registries build_config checks names against
        cfg = build_config(payload["config"], for_run=False)
        self.policy = make_policy_factory(cfg, os.getcwd())(self.obs_space, self.action_space)[DEFAULT_POLICY_ID]
        self.version = -1
        self.policy.reseed(int(cfg.seed) + 7919 * os.getpid())  # each client process samples its own actions
        self.update(payload)

    def update(self, payload: dict[str, Any]) -> None:
        if "weights" not in payload:
            return
        self.policy.set_weights({k: decode_array(w["data"], w["dtype"], w["shape"])
                                 for k, w in payload["weights"].items()})
        self.policy.global_timestep = int(payload.get("global_timestep", 0))
        self.version = int(payload["version"])

    def act(self, obs: Any, action: Any = None) -> tuple[Any, float, float, np.ndarray]:
        """(action, logp, V(s), dist inputs); the given action's logp when the client chose it. The
        built-in MLP + categorical acts in numpy (rlrun/models/numpy_actor.py)."""
        return act_one(self.policy, np.asarray(obs, dtype=self.obs_space.dtype), action)


    def act_batch(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(actions, logp, V(s), dist inputs) for ``obs`` ([N, ...]), the policy choosing every action."""
        out = self.policy.compute_actions(np.asarray(obs, dtype=self.obs_space.dtype), True, [])
        return out.actions, out.logp, out.values, out.dist_inputs
