"""SAC's update on the built-in ``twin_q_mlp`` without autograd: the gradients of the ``sac`` loss
(critics, actor, temperature), derived by hand.

Why: one SAC update of a 256-row minibatch on 256x256 nets is ~16 products of 256x256x256 (~3 ms on
two threads here) and, under autograd, ~3-4 ms more of operator calls, graph nodes and freshly
allocated 256 KB-1 MB activations (experiments/continuous_control). Here the same arithmetic runs with
no graph, into buffers kept between updates: 1.11x the learner's updates/s at HalfCheetah's sizes on two
threads (16 interleaved pairs, experiments/continuous_control/README.md). The gradients equal autograd's
to float rounding (tests/test_twin_q_grad.py); ``algo.hand_gradient: false`` gives autograd back.

The loss, as ``rlrun.algos.sac.sac_loss`` computes it (B rows, C critics, a' ~ pi(s'), a~ ~ pi(s),
both reparameterised u = mean + std * noise, a = tanh(u)):
  critic: 0.5 sum_c mean_b (Q_c(s, a) - y)^2,  y = R_n + gamma^n (min_c Q'_c(s', a') - alpha log pi(a'|s'))
  actor:  mean_b (alpha log pi(a~|s) - min_c Q_c(s, a~)), the critics' weights held fixed
  alpha:  -log alpha * mean_b (log pi(a~|s) + target_entropy)
with log pi(a|s) = sum_i (-noise_i^2 / 2 - log std_i - log(2 pi) / 2) - sum_i 2 (log 2 - u_i - softplus(-2 u_i)),
whose derivative in u_i (at fixed noise) is 2 tanh(u_i), and in log std_i -1 (plus u's std_i noise_i).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

import torch
from torch import nn

from rlrun.models.distributions import SquashedGaussian
from rlrun.models.mlp_grad import HAND_ACTIVATIONS, Buffers, Torso, act_backward, flat, grad_buffer
from rlrun.models.twin_q import CriticStack, TwinQModel


class SACStep(NamedTuple):
    """What one hand-derived SAC gradient step computed: each loss term, and the statistics of ``sac``."""

    critic: torch.Tensor
    actor: torch.Tensor
    alpha_loss: torch.Tensor
    q_mean: torch.Tensor
    target_mean: torch.Tensor
    entropy: torch.Tensor


class _Sample(NamedTuple):
    a: torch.Tensor  # tanh(u), [B, A]
    logp: torch.Tensor  # [B]
    noise: torch.Tensor
    std: torch.Tensor
    in_range: torch.Tensor  # where the raw log-std was inside [LOG_STD_MIN, LOG_STD_MAX] (clamp passes gradients)


class TwinQGrad:
    """The SAC update's forward passes and gradients for one ``TwinQModel`` and its target copy,
    reading their parameters in place (optimizer steps and the Polyak step write them in place)."""

    def __init__(self, model: TwinQModel, target: Any) -> None:
        self.actor = Torso(model._layers, model._act is torch.relu)
        self.head: nn.Linear = model.head
        self.critics: CriticStack = model.critics
        self.target_critics: CriticStack = target.critics
        self.relu = self.actor.relu  # the critics use the model's activation too
        self.model = model
        self._bufs = Buffers()

    @staticmethod
    def supports(model: Any, target: Any) -> TypeGuard[TwinQModel]:
        """The built-in ``twin_q_mlp`` exactly (not a subclass) with ReLU or tanh and float32 parameters
        that all train, its target a copy of the same shapes."""
        if type(model) is not TwinQModel or type(target) is not TwinQModel or model._act not in HAND_ACTIVATIONS:
            return False
        if type(model.head) is not nn.Linear or any(type(la) is not nn.Linear for la in model._layers):
            return False
        params = list(model.parameters())
        same = [p.shape for p in target.critics.parameters()] == [p.shape for p in model.critics.parameters()]
        return same and all(p.dtype == torch.float32 and p.requires_grad for p in params)

    # ------------------------------------------------------------------ forward passes
    def _actor(self, obs: torch.Tensor, key: str) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The actor's input and hidden activations (in the buffers named ``key``) and its outputs [B, 2A]."""
        hs = self.actor.forward(flat(obs), key)
        return hs, torch.addmm(self.head.bias, hs[-1], self.head.weight.t())

    @staticmethod
    def _sample(out: torch.Tensor, generator: torch.Generator) -> _Sample:
        """``SquashedGaussian(out).sample_logp(generator)``, keeping what the backward pass needs."""
        dist = SquashedGaussian(out)
        a, logp, noise = dist.sample_logp_noise(generator)
        raw = out[:, out.shape[1] // 2 :]
        in_range = (raw >= SquashedGaussian.LOG_STD_MIN) & (raw <= SquashedGaussian.LOG_STD_MAX)
        return _Sample(a, logp, noise, dist.std, in_range)

    def _critic(self, stack: CriticStack, x: torch.Tensor, key: str) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every critic's input and hidden activations ``[C, B, width]`` and Q-values ``[C, B]``."""
        shapes = [(stack.num, len(x), int(w.shape[-1])) for w in stack.weights]
        bufs = self._bufs.get(key, shapes)
        gs = [x.unsqueeze(0).expand(stack.num, *x.shape)]
        for w, b, buf in zip(stack.weights, stack.biases, bufs, strict=True):
            g = torch.baddbmm(b, gs[-1], w, out=buf)
            gs.append(g.relu_() if self.relu else g.tanh_())
        return gs, (gs[-1] * stack.out_weight).sum(-1) + stack.out_bias

    def _sa(self, obs: torch.Tensor, unit_actions: torch.Tensor) -> torch.Tensor:
        return torch.cat([flat(obs), unit_actions.reshape(len(unit_actions), -1)], dim=-1)

    # ------------------------------------------------------------------ backward passes
    def _critic_backward(self, gs: list[torch.Tensor], dq: torch.Tensor, key: str,
                         weights: bool) -> torch.Tensor | None:
        """Back-propagate ``dq [C, B]`` through the critics: into their ``.grad`` (``weights``), or,
        without touching their gradients, to the input's action columns (returns ``[B, A]``)."""
        stack = self.critics
        if weights:
            torch.bmm(dq.unsqueeze(1), gs[-1], out=grad_buffer(stack.out_weight))
            torch.sum(dq, 1, keepdim=True, out=grad_buffer(stack.out_bias))
        shapes = [(stack.num, dq.shape[1], int(w.shape[-1])) for w in stack.weights]
        dzs = self._bufs.get(key + "/dz", shapes)
        dg = dq.unsqueeze(-1) * stack.out_weight
        for i in range(len(stack.weights) - 1, -1, -1):
            w = stack.weights[i]
            dz = act_backward(self.relu, dg, gs[i + 1], dzs[i])
            if weights:
                torch.bmm(gs[i].transpose(1, 2), dz, out=grad_buffer(w))
                torch.sum(dz, 1, keepdim=True, out=grad_buffer(stack.biases[i]))
            if i:
                dg = torch.bmm(dz, w.transpose(1, 2))
            elif not weights:
                obs_dim = int(w.shape[1]) - self.head.out_features // 2
                return torch.bmm(dz, w[:, obs_dim:, :].transpose(1, 2)).sum(0)
        return None

    def _actor_backward(self, hs: list[torch.Tensor], d_out: torch.Tensor) -> None:
        torch.mm(d_out.t(), hs[-1], out=grad_buffer(self.head.weight))
        torch.sum(d_out, 0, out=grad_buffer(self.head.bias))
        self.actor.backward(hs, d_out, self.head.weight, "actor")

    # ------------------------------------------------------------------ the update
    @torch.no_grad()
    def gradient(self, batch: dict[str, torch.Tensor], columns: tuple[str, str, str, str, str],
                 alpha: torch.Tensor, log_alpha: torch.Tensor | None, target_entropy: float,
                 generator: torch.Generator) -> SACStep:
        """Set the ``.grad`` of every actor and critic parameter (and of ``log_alpha`` when the
        temperature is learned) to the gradient of the ``sac`` loss on ``batch``. ``columns``: the
        batch's keys of obs, actions, n-step next obs, n-step rewards, n-step discounts."""
        obs_k, act_k, next_k, rew_k, disc_k = columns
        obs, next_obs = batch[obs_k], batch[next_k]
        n = len(obs)
        # the target, as sac_loss draws it: the actor's sample at s' first, then the one at s
        _, out_next = self._actor(next_obs, "next")
        nxt = self._sample(out_next, generator)
        _, q_target = self._critic(self.target_critics, self._sa(next_obs, nxt.a), "target")
        q_next = q_target.amin(0) - alpha * nxt.logp
        target = torch.addcmul(batch[rew_k], batch[disc_k], q_next)
        # critics
        gs, q = self._critic(self.critics, self._sa(obs, self.model.to_unit(batch[act_k])), "critic")
        err = q - target
        critic = 0.5 * err.pow(2).mean(-1).sum()
        # actor: its sample at s through the critics (their weights fixed)
        hs, out = self._actor(obs, "actor")
        cur = self._sample(out, generator)
        gs_pi, q_pi = self._critic(self.critics, self._sa(obs, cur.a), "actor_q")
        q_min, which = q_pi.min(0)
        actor = (alpha * cur.logp - q_min).mean()
        alpha_loss = torch.zeros(())
        if log_alpha is not None:
            alpha_loss = -(log_alpha * (cur.logp + target_entropy)).mean()
            log_alpha.grad = -(cur.logp + target_entropy).mean()
        self._critic_backward(gs, err.div_(n), "critic", weights=True)
        dq_pi = torch.zeros_like(q_pi).scatter_(0, which.unsqueeze(0), -1.0 / n)
        da = self._critic_backward(gs_pi, dq_pi, "actor_q", weights=False)
        assert da is not None
        # a = tanh(u), u = mean + std * noise; d logp / du = 2 tanh(u) = 2 a; d logp / d log_std = -1
        scale = alpha / n
        du = da * (1.0 - cur.a * cur.a) + (2.0 * scale) * cur.a
        d_log_std = (du * cur.noise * cur.std - scale) * cur.in_range
        self._actor_backward(hs, torch.cat([du, d_log_std], dim=-1))
        return SACStep(critic, actor, alpha_loss, q.mean(), target.mean(), -cur.logp.mean())
