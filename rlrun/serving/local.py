"""Local inference for ``PolicyClient(..., inference="local")``: the run's policy, rebuilt in the
client's process from the server's ``policy`` answer (config + weights), acting without a round
trip. Imports torch and rlrun's policy code, so only local mode loads it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from rlrun.config import build_config
from rlrun.offline.spaces import space_from_json
from rlrun.plugins import load_builtins
from rlrun.policy import DEFAULT_POLICY_ID
from rlrun.serving.wire import decode_array
from rlrun.workers import make_policy_factory


class LocalPolicy:
    def __init__(self, info: dict[str, Any], payload: dict[str, Any]) -> None:
        torch.set_num_threads(1)  # small models, one step at a time: threads only add overhead
        self.obs_space = space_from_json(info["observation_space"])
        self.action_space = space_from_json(info["action_space"])
        load_builtins()  # the registries build_config checks names against
        cfg = build_config(payload["config"])
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
        built-in MLP + categorical acts in numpy (rlrun/numpy_actor.py)."""
        return act_one(self.policy, np.asarray(obs, dtype=self.obs_space.dtype), action)


    def act_batch(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(actions, logp, V(s), dist inputs) for ``obs`` ([N, ...]), the policy choosing every action."""
        out = self.policy.compute_actions(np.asarray(obs, dtype=self.obs_space.dtype), True, [])
        return out.actions, out.logp, out.values, out.dist_inputs


def act_one(policy: Any, obs: np.ndarray, action: Any = None, explore: bool = True) -> tuple[Any, float, float,
                                                                                            np.ndarray]:
    """One observation through a Policy: (action, logp, V(s), dist inputs); with ``action`` given (the
    client chose it), that action's log-probability. The server's and the local client's torch path."""
    out = policy.compute_actions(obs[None], explore, [])
    if action is None:
        return out.actions[0], float(out.logp[0]), float(out.values[0]), out.dist_inputs[0]
    logp = policy.logp_of(out.dist_inputs, np.asarray(action)[None])
    return action, float(logp[0]), float(out.values[0]), out.dist_inputs[0]
