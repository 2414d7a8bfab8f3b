"""Local inference for ``PolicyClient(..., inference="local")``: the run's policy, rebuilt in the
client's process from the server's ``policy`` answer (config + weights), acting without a round
trip. Imports torch and rlrun's policy code, so only local mode loads it."""

from __future__ import annotations

import base64
import os
from typing import Any

import numpy as np
import torch

from rlrun.config import build_config
from rlrun.plugins import load_builtins
from rlrun.policy import DEFAULT_POLICY_ID
from rlrun.serving.protocol import space_from_json
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
        self.update(payload)

    def update(self, payload: dict[str, Any]) -> None:
        if "weights" not in payload:
            return
        self.policy.set_weights({k: _array(w) for k, w in payload["weights"].items()})
        self.policy.global_timestep = int(payload.get("global_timestep", 0))
        self.version = int(payload["version"])

    def act(self, obs: Any, action: Any = None) -> tuple[Any, float, float, np.ndarray]:
        """(action, logp, V(s), dist inputs); the given action's logp when the client chose it."""
        out = self.policy.compute_actions(np.asarray(obs, dtype=self.obs_space.dtype)[None], True, [])
        if action is None:
            return out.actions[0], float(out.logp[0]), float(out.values[0]), out.dist_inputs[0]
        with torch.inference_mode():
            dist = self.policy.dist_class(torch.as_tensor(out.dist_inputs))
            logp = dist.logp(torch.as_tensor(np.asarray(action)[None]))
        return action, float(logp.item()), float(out.values[0]), out.dist_inputs[0]


def _array(w: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(w["dtype"])
    return np.frombuffer(base64.b64decode(w["data"]), dtype=dtype.newbyteorder("<")).astype(dtype).reshape(w["shape"])
