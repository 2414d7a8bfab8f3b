"""Local inference for ``PolicyClient(..., inference="local")``: the run's policy, rebuilt in the
client's process from the server's ``policy`` answer (config + weights), acting without a round
trip. Imports torch and rlrun's policy code, so only local mode loads it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlrun.config import build_config
from rlrun.offline.spaces import space_from_json
from rlrun.plugins import load_builtins
from rlrun.policy import DEFAULT_POLICY_ID
from rlrun.serving.wire import decode_array
from rlrun.workers import make_policy_factory

_NUMPY_ACT: dict[Any, Callable[[np.ndarray], np.ndarray]] = {torch.tanh: np.tanh,
                                                          torch.relu: lambda x: np.maximum(x, 0.0)}


class NumpyMLP:
    """The built-in ``mlp`` model with a categorical action distribution, in numpy: one step of one
    observation costs 31-38 us instead of torch's 125-139 us (measured here), and py-spy showed
    torch's ``compute_actions`` taking 72% of a local client's time. Samples with its own generator."""

    def __init__(self, model: Any, seed: int) -> None:
        def arrays(layers: Any) -> list[tuple[np.ndarray, np.ndarray]]:
            return [(la.weight.detach().numpy().astype(np.float64), la.bias.detach().numpy().astype(np.float64))
                    for la in layers]

        self.act = _NUMPY_ACT[model._act]
        self.pi = arrays(model._pi_layers)
        self.vf = None if model._vf_layers is None else arrays(model._vf_layers)
        self.pi_head, self.vf_head = arrays([model.pi_head])[0], arrays([model.vf_head])[0]
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def supports(policy: Any) -> bool:
        from rlrun.distributions import Categorical
        from rlrun.models import MLPModel

        model = policy.model
        return (isinstance(model, MLPModel) and policy.dist_class is Categorical and model._act in _NUMPY_ACT
                and policy.hooks.compute_actions is None and not policy.obs_filter.active)

    def __call__(self, obs: Any, action: Any) -> tuple[Any, float, float, np.ndarray]:
        x = np.asarray(obs, dtype=np.float64).ravel()
        logits, value = self._forward(x)
        z = logits - logits.max()
        logp = z - np.log(np.exp(z).sum())
        if action is None:
            action = int(np.searchsorted(np.cumsum(np.exp(logp)), self.rng.random() * np.exp(logp).sum()))
            action = min(action, len(logp) - 1)
        return action, float(logp[action]), float(value[0]), logits.astype(np.float32)

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logits and V for ``x`` ([d] or [N, d]); weights are [out, in]."""
        h = x
        for w, b in self.pi:
            h = self.act(h @ w.T + b)
        logits = h @ self.pi_head[0].T + self.pi_head[1]
        hv = h
        if self.vf is not None:
            hv = x
            for w, b in self.vf:
                hv = self.act(hv @ w.T + b)
        return logits, hv @ self.vf_head[0].T + self.vf_head[1]

    def batch(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Sampled actions, their logp, V and logits for ``obs`` ([N, d]): one forward for N episodes."""
        logits, value = self._forward(np.asarray(obs, dtype=np.float64).reshape(len(obs), -1))
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        cdf = np.cumsum(np.exp(logp), axis=1)
        u = self.rng.random(len(obs)) * cdf[:, -1]
        actions = np.minimum((u[:, None] > cdf).sum(axis=1), logits.shape[1] - 1)
        rows = np.arange(len(obs))
        return actions, logp[rows, actions].astype(np.float32), value[:, 0].astype(np.float32), \
            logits.astype(np.float32)


class LocalPolicy:
    def __init__(self, info: dict[str, Any], payload: dict[str, Any]) -> None:
        torch.set_num_threads(1)  # small models, one step at a time: threads only add overhead
        self.obs_space = space_from_json(info["observation_space"])
        self.action_space = space_from_json(info["action_space"])
        load_builtins()  # the registries build_config checks names against
        cfg = build_config(payload["config"])
        self.policy = make_policy_factory(cfg, os.getcwd())(self.obs_space, self.action_space)[DEFAULT_POLICY_ID]
        self.version = -1
        self._fast: NumpyMLP | None = None
        self.update(payload)

    def update(self, payload: dict[str, Any]) -> None:
        if "weights" not in payload:
            return
        self.policy.set_weights({k: decode_array(w["data"], w["dtype"], w["shape"])
                                 for k, w in payload["weights"].items()})
        self.policy.global_timestep = int(payload.get("global_timestep", 0))
        self.version = int(payload["version"])
        if NumpyMLP.supports(self.policy):
            self._fast = NumpyMLP(self.policy.model, self.version + 7919 * os.getpid())

    def act(self, obs: Any, action: Any = None) -> tuple[Any, float, float, np.ndarray]:
        """(action, logp, V(s), dist inputs); the given action's logp when the client chose it."""
        if self._fast is not None:
            return self._fast(obs, action)
        return act_one(self.policy, np.asarray(obs, dtype=self.obs_space.dtype), action)


    def act_batch(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(actions, logp, V(s), dist inputs) for ``obs`` ([N, ...]), the policy choosing every action."""
        if self._fast is not None:
            return self._fast.batch(obs)
        out = self.policy.compute_actions(np.asarray(obs, dtype=self.obs_space.dtype), True, [])
        return out.actions, out.logp, out.values, out.dist_inputs


def act_one(policy: Any, obs: np.ndarray, action: Any = None, explore: bool = True) -> tuple[Any, float, float,
                                                                                            np.ndarray]:
    """One observation through a Policy: (action, logp, V(s), dist inputs); with ``action`` given (the
    client chose it), that action's log-probability. The server's and the local client's torch path."""
    out = policy.compute_actions(obs[None], explore, [])
    if action is None:
        return out.actions[0], float(out.logp[0]), float(out.values[0]), out.dist_inputs[0]
    with torch.inference_mode():
        logp = policy.dist_class(torch.as_tensor(out.dist_inputs)).logp(torch.as_tensor(np.asarray(action)[None]))
    return action, float(logp.item()), float(out.values[0]), out.dist_inputs[0]
