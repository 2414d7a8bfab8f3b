"""Acting without torch for the built-in ``mlp`` model with a categorical or diagonal Gaussian
action distribution, and for DQN's built-in ``q_mlp`` (``NumpyQ``: plain or Rainbow's heads).

A rollout worker calls the policy once per vector step on a few dozen rows. At that size torch's
per-op dispatch dominates. Measured here (2-core VM, ``compute_actions`` of the 64x64 ``ppo_cartpole``
policy, median of 3): 1 row 210 us in torch, 78 us in numpy; 16 rows 220 / 124 us; 64 rows 308 / 253 us.
In-process sampling (``experiments/sampling_throughput``, interleaved with the torch version): 1
sub-env 2.5-2.7k -> 3.9-5.2k env steps/s, 64 sub-envs 107-139k -> 188-193k; one exp per draw
and the two-action path below then took 64 sub-envs from 269k to 333k (medians, 3 interleaved
pairs, the 32-unit ``ppo_cartpole`` net). The arrays here are
float32 views of the torch parameters, so they follow every optimizer step and ``load_state_dict``
(both write the parameters in place) with nothing to copy. Sampling uses the policy's numpy
generator, which checkpoints already carry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


_NUMPY_ACT: dict[Any, Callable[[np.ndarray], np.ndarray]] = {torch.tanh: _tanh, torch.relu: _relu}
Layer = tuple[np.ndarray, np.ndarray]  # (weight [in, out] view, bias [out] view)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _views(layer: torch.nn.Linear) -> Layer:
    return layer.weight.detach().numpy().T, layer.bias.detach().numpy()


def _torso(act: Callable[[np.ndarray], np.ndarray], layers: list[Layer], x: np.ndarray) -> np.ndarray:
    """``act(x @ w + b)`` through ``layers``: the hidden layers of both models here."""
    for w, b in layers:
        x = act(x @ w + b)
    return x


def _flat(obs: np.ndarray) -> np.ndarray:
    return np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)


class NumpyActor:
    """Distribution inputs, values, sampled actions and their log-probabilities of an ``MLPModel``
    in numpy: logits of a ``Categorical``, or means then log-stds of a ``DiagGaussian``."""

    def __init__(self, model: Any, rng: np.random.Generator, gaussian: bool = False) -> None:
        self.act = _NUMPY_ACT[model._act]
        self.pi = [_views(la) for la in model._pi_layers]
        self.vf = None if model._vf_layers is None else [_views(la) for la in model._vf_layers]
        self.pi_head, self.vf_head = _views(model.pi_head), _views(model.vf_head)
        self.log_std = model.log_std.detach().numpy() if model.free_log_std else None  # a view too
        self.gaussian = gaussian
        self.rng = rng
        self._rows = np.arange(0)  # row indices of the last batch size, reused

    @staticmethod
    def supports(policy: Any) -> bool:
        """The policy's actions come from the built-in MLP and a categorical or diagonal Gaussian
        distribution (no algorithm hook of its own, an activation numpy has, float32 parameters)."""
        from rlrun.models.base import MLPModel

        model = policy.model
        return (type(model) is MLPModel and NumpyActor.kind(policy) is not None and model._act in _NUMPY_ACT
                and policy.hooks.compute_actions is None
                and all(p.dtype == torch.float32 for p in model.parameters()))

    @staticmethod
    def kind(policy: Any) -> str | None:
        """'categorical', 'gaussian', or None for a distribution this module does not sample."""
        from rlrun.models.distributions import Categorical, DiagGaussian

        return {Categorical: "categorical", DiagGaussian: "gaussian"}.get(policy.dist_class)

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distribution inputs ``[N, K]`` and values ``[N]`` for observations ``[N, ...]``."""
        x = _flat(obs)
        h = _torso(self.act, self.pi, x)
        out = h @ self.pi_head[0] + self.pi_head[1]
        if self.log_std is not None:
            out = np.concatenate([out, np.broadcast_to(self.log_std, out.shape)], axis=1)
        hv = h if self.vf is None else _torso(self.act, self.vf, x)
        return out, (hv @ self.vf_head[0] + self.vf_head[1])[:, 0]

    def logp_of(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The log-probability of each row's action."""
        if self.gaussian:
            return _gaussian_logp(dist_inputs, np.asarray(actions, dtype=np.float32))
        z = dist_inputs - dist_inputs.max(axis=1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return logp_all[np.arange(len(dist_inputs)), np.asarray(actions, dtype=np.int64)]

    def compute_actions(self, obs: np.ndarray, explore: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                           np.ndarray]:
        """(actions, their logp, values, distribution inputs): sampled with ``explore``, else the
        most likely."""
        dist_inputs, values = self.forward(obs)
        if self.gaussian:
            actions, logp = self._sample_gaussian(dist_inputs, explore)
        elif explore and dist_inputs.shape[1] == 2:
            actions, logp = self._sample_two(dist_inputs)
        else:
            actions, logp = self._sample_categorical(dist_inputs, explore)
        return actions, logp, values, dist_inputs

    def _sample_categorical(self, logits: np.ndarray, explore: bool) -> tuple[np.ndarray, np.ndarray]:
        """One exp serves both the log-softmax and the sampling: an action is drawn by inverse CDF on
        the unnormalised ``exp(z)`` (u scaled by its sum), and the per-row pick is plain fancy
        indexing (``take_along_axis`` cost ~15 us of a 64-row call here)."""
        z = logits - logits.max(axis=1, keepdims=True)
        cdf = np.exp(z).cumsum(axis=1)
        total = cdf[:, -1]
        n = len(logits)
        if explore:
            u = self.rng.random(n, dtype=np.float32) * total
            actions = np.minimum((u[:, None] > cdf).sum(axis=1), logits.shape[1] - 1)
        else:
            actions = logits.argmax(axis=1)
        if len(self._rows) != n:
            self._rows = np.arange(n)
        return actions, z[self._rows, actions] - np.log(total)

    def _sample_two(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Two actions (CartPole's case): the same draw as the inverse CDF (action 1 iff u > p(0)),
        with both log-probabilities from one softplus of the log-odds: 8.8 us instead of 21 us for
        64 rows here, ~5% of a 64-sub-env vector step."""
        d = logits[:, 1] - logits[:, 0]
        softplus = np.logaddexp(0.0, d)  # -log p(0)
        u = self.rng.random(len(d), dtype=np.float32)
        actions = (u > np.exp(-softplus)).astype(np.int64)
        return actions, np.where(actions == 1, d - softplus, -softplus)

    def _sample_gaussian(self, dist_inputs: np.ndarray, explore: bool) -> tuple[np.ndarray, np.ndarray]:
        """mean + std * N(0, 1) noise (the mean itself without ``explore``), unclipped."""
        mean, log_std = np.split(dist_inputs, 2, axis=1)
        if not explore:
            return mean, _gaussian_logp(dist_inputs, mean)
        noise = self.rng.standard_normal(mean.shape, dtype=np.float32)
        actions = mean + np.exp(log_std) * noise
        return actions, _std_normal_logp(noise, log_std)  # the drawn noise is the action's z-score


def _gaussian_logp(dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    mean, log_std = np.split(dist_inputs, 2, axis=1)
    return _std_normal_logp((actions - mean) / np.exp(log_std), log_std)


def _std_normal_logp(z: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """Per row, the diagonal Gaussian's log-density of an action ``z`` standard deviations from the mean."""
    return (-0.5 * z * z - log_std - np.float32(_HALF_LOG_2PI)).sum(axis=1)


class NumpyQ:
    """Q-values of the built-in ``q_mlp`` in numpy, on views of its parameters: dueling or not,
    expected Q-values or C51's atoms, plain or noisy heads. DQN acts on one row per sub-env per step:
    with 1 sub-env the torch forward pass of the 256x256 net cost ~275 us of a ~324 us env step here,
    a third of ``dqn_cartpole``'s wall time. ``rainbow_cartpole``'s noisy C51 heads: 155 against 384 us
    a call in torch (one row, exploring; medians of 5 interleaved blocks of 2,000 calls)."""

    def __init__(self, model: Any) -> None:
        self.act = _NUMPY_ACT[model._act]
        self.torso = [_views(la) for la in model._layers]
        self.adv, self.v = _Head(model.adv_head), None if model.v_head is None else _Head(model.v_head)
        self.num_actions, self.num_atoms = model.num_actions, model.num_atoms
        self.support = model.support.numpy()

    @staticmethod
    def supports(model: Any) -> bool:
        """For a ``QMLPModel`` (the caller checks the type): an activation numpy has, float32 weights,
        heads that are ``nn.Linear`` or ``NoisyLinear`` exactly."""
        from rlrun.models.noisy import NoisyLinear

        heads = [model.adv_head] + ([model.v_head] if model.v_head is not None else [])
        return (model._act in _NUMPY_ACT and all(p.dtype == torch.float32 for p in model.parameters())
                and all(type(h) in (torch.nn.Linear, NoisyLinear) for h in heads))

    def q_values(self, obs: np.ndarray, noise: np.random.Generator | None = None) -> np.ndarray:
        """``[N, num_actions]`` for observations ``[N, ...]``; with ``noise``, noisy heads draw their
        factorised noise from it (the advantage head's, then the value head's, each ``e_in`` then
        ``e_out``), otherwise they use their means."""
        h = _torso(self.act, self.torso, _flat(obs))
        heads = [self.adv] if self.v is None else [self.adv, self.v]
        noisy = noise is not None and any(hd.sigma is not None for hd in heads)
        # one draw for all of them: the same numbers as one draw each (the generator's stream is sequential)
        e = _scaled_noise(noise, sum(hd.noise_size for hd in heads)) if noisy and noise is not None else None
        q = self.adv(h, e)
        if self.v is not None:
            e_v = None if e is None else e[self.adv.noise_size:]
            if self.num_atoms == 1:
                return self.v(h, e_v) + (q - q.mean(axis=1, keepdims=True))
            q3 = q.reshape(len(h), self.num_actions, self.num_atoms)
            q = self.v(h, e_v)[:, None, :] + (q3 - q3.mean(axis=1, keepdims=True))
        if self.num_atoms == 1:
            return q
        z = q.reshape(len(h), self.num_actions, self.num_atoms)
        ez = np.exp(z - z.max(axis=-1, keepdims=True))
        return (ez @ self.support) / ez.sum(axis=-1)


class _Head:
    """A plain or noisy linear head on views of its parameters: ``x @ w + b``, plus with noise
    ``e_out * ((x * e_in) @ w_sigma + b_sigma)``, ``e = sign(n) sqrt(|n|)``, ``n ~ N(0, 1)``."""

    def __init__(self, layer: Any) -> None:
        self.w, self.b = _views(layer)
        sigma = getattr(layer, "weight_sigma", None)
        self.sigma = None if sigma is None else (sigma.detach().numpy().T, layer.bias_sigma.detach().numpy())
        self.noise_size = 0 if sigma is None else sum(self.w.shape)  # e_in, then e_out

    def __call__(self, x: np.ndarray, e: np.ndarray | None) -> np.ndarray:
        """``e``: this head's noise first (``e_in``, ``e_out``), anything after it ignored; None: the means."""
        y = x @ self.w + self.b
        if self.sigma is None or e is None:
            return y
        n_in, n_out = self.w.shape
        return y + e[n_in:n_in + n_out] * ((x * e[:n_in]) @ self.sigma[0] + self.sigma[1])


def _scaled_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    e = rng.standard_normal(n, dtype=np.float32)
    return np.copysign(np.sqrt(np.abs(e)), e)
