"""SAC's update on the built-in ``twin_q_mlp`` without autograd: the gradients of the ``sac`` loss
(critics, actor, temperature), derived by hand.

Why: one SAC update of a 256-row minibatch on 256x256 nets is ~16 products of 256x256x256 (~3 ms on
two threads here) and, under autograd, ~3-4 ms more of operator calls, graph nodes and freshly
allocated 256 KB-1 MB activations (experiments/continuous_control). Here the same arithmetic runs with
no graph, into buffers kept between updates: 1.11x the learner's updates/s at HalfCheetah's sizes on two
threads (16 interleaved pairs, experiments/continuous_control/README.md). The gradients equal autograd's
to float rounding (tests/test_twin_q_grad.py); ``algo.hand_gradient: false`` gives autograd back.
Two more cuts (2026-11-29, 2-core AMD EPYC, learn() on a filled buffer, 5 alternating runs of 3 x 512
updates each against the code before): the actor's passes at s' and at s as one of 2B rows, and the
actor term's backward through each row's minimum critic only (half of a pass through every critic):
median 10.14 against 11.19 ms an update (0.95x, median of the pairs' ratios; faster in 5 of 5 pairs).

The loss, as ``rlrun.algos.sac.sac_loss`` computes it in two stages (B rows, C critics, a' ~ pi(s'),
a~ ~ pi(s), both reparameterised u = mean + std * noise, a = tanh(u)); the Policy steps the critics between
them, so the actor's term passes through the stepped critics (``critic_gradient``, then ``actor_gradient``):
  critic: 0.5 sum_c mean_b (Q_c(s, a) - y)^2,  y = R_n + gamma^n (min_c Q'_c(s', a') - alpha log pi(a'|s'))
  actor:  mean_b (alpha log pi(a~|s) - min_c Q_c(s, a~)), the critics' weights held fixed
  alpha:  -log alpha * mean_b (log pi(a~|s) + target_entropy)
with log pi(a|s) = sum_i (-noise_i^2 / 2 - log std_i - log(2 pi) / 2) - sum_i log(1 - a_i^2 + 1e-6), whose
derivative in a_i is 2 a_i / (1 - a_i^2 + 1e-6), in u_i (at fixed noise) that times (1 - a_i^2), and in log std_i
-1 (plus u's std_i noise_i).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

import torch
from torch import nn

from rlrun.models import gemm
from rlrun.models.distributions import SquashedGaussian
from rlrun.models.mlp_grad import HAND_ACTIVATIONS, Buffers, Torso, act_backward, flat, grad_buffer
from rlrun.models.twin_q import CriticStack, TwinQModel


class CriticStep(NamedTuple):
    """What the hand-derived critic stage computed: its loss and the statistics of ``sac_critic_loss``."""

    critic: torch.Tensor
    q_mean: torch.Tensor
    target_mean: torch.Tensor


class ActorStep(NamedTuple):
    """What the hand-derived actor stage computed: its loss terms and ``sac_actor_loss``'s entropy."""

    actor: torch.Tensor
    alpha_loss: torch.Tensor
    entropy: torch.Tensor


class _Sample(NamedTuple):
    a: torch.Tensor  # tanh(u), [B, A]
    logp: torch.Tensor  # [B]
    noise: torch.Tensor
    std: torch.Tensor
    in_range: torch.Tensor  # where the raw log-std was inside [LOG_STD_MIN, LOG_STD_MAX] (clamp passes gradients)


class _Stack(NamedTuple):
    """A ``CriticStack``'s parameters as plain lists, read once: ``ParameterList`` indexing and iteration
    go through ``nn.Module.__getattr__`` (~0.1 ms of an update here); the tensors are updated in place."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor]
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    num: int

    @staticmethod
    def of(stack: CriticStack) -> _Stack:
        return _Stack(list(stack.weights), list(stack.biases), stack.out_weight, stack.out_bias, stack.num)


def draw_noise(n: int, dims: int, generator: torch.Generator) -> torch.Tensor:
    """The actor's standard-normal noise for ``n`` rows at s' then ``n`` at s, ``[2n, dims]``, drawn as two draws of
    ``n`` rows in that order (as ``sac_loss``'s two stages draw it)."""
    noise = torch.empty(2 * n, dims)
    torch.randn((n, dims), generator=generator, out=noise[:n])
    torch.randn((n, dims), generator=generator, out=noise[n:])
    return noise


def squashed_sample(out: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``SquashedGaussian(out).sample_logp_noise(noise=noise)``'s sample ``a`` and log-probability, the std, and
    where the raw log-std was inside [LOG_STD_MIN, LOG_STD_MAX] (the clamp passes gradients there)."""
    dist = SquashedGaussian(out)
    a, logp, _ = dist.sample_logp_noise(noise=noise)
    raw = out[:, out.shape[1] // 2 :]
    return a, logp, dist.std, (raw >= SquashedGaussian.LOG_STD_MIN) & (raw <= SquashedGaussian.LOG_STD_MAX)


class ActorCriticGrad:
    """Forward and backward passes through one ``TwinQModel``'s actor and critic stack and its target's critics
    without autograd, reading their parameters in place (optimizer steps and the Polyak step write them in place):
    what SAC's update (``TwinQGrad``) and TD3's (``rlrun.models.td3_grad``) are made of."""

    def __init__(self, model: TwinQModel, target: Any) -> None:
        self.actor = Torso(model._layers, model._act is torch.relu)
        self.head: nn.Linear = model.head
        self.critics = _Stack.of(model.critics)
        self.target_critics = _Stack.of(target.critics)
        self.act_dim = int(model.action_half.numel())
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
        """The actor's input and hidden activations (in the buffers named ``key``) and its outputs (the action
        distribution's inputs: SAC's [B, 2A], TD3's [B, A])."""
        hs = self.actor.forward(flat(obs), key)
        return hs, torch.addmm(self.head.bias, hs[-1], self.head.weight.t())

    def _critic(self, stack: _Stack, x: torch.Tensor, key: str) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every critic's input and hidden activations ``[C, B, width]`` and Q-values ``[C, B]``."""
        shapes = [(stack.num, len(x), int(w.shape[-1])) for w in stack.weights]
        bufs = self._bufs.get(key, shapes)
        gs = [x.unsqueeze(0).expand(stack.num, *x.shape)]
        for w, b, buf in zip(stack.weights, stack.biases, bufs, strict=True):
            gs.append(gemm.baddbmm_act(b, gs[-1], w, self.relu, buf))
        return gs, (gs[-1] * stack.out_weight).sum(-1) + stack.out_bias

    def _sa(self, obs: torch.Tensor, unit_actions: torch.Tensor) -> torch.Tensor:
        return torch.cat([flat(obs), unit_actions.reshape(len(unit_actions), -1)], dim=-1)

    # ------------------------------------------------------------------ backward passes
    def _critic_backward(self, gs: list[torch.Tensor], dq: torch.Tensor) -> None:
        """Back-propagate ``dq [C, B]`` through the critics into their ``.grad``."""
        stack = self.critics
        torch.bmm(dq.unsqueeze(1), gs[-1], out=grad_buffer(stack.out_weight))
        torch.sum(dq, 1, keepdim=True, out=grad_buffer(stack.out_bias))
        shapes = [(stack.num, dq.shape[1], int(w.shape[-1])) for w in stack.weights]
        dzs = self._bufs.get("critic/dz", shapes)
        dg = dq.unsqueeze(-1) * stack.out_weight
        for i in range(len(stack.weights) - 1, -1, -1):
            w = stack.weights[i]
            dz = act_backward(self.relu, dg, gs[i + 1], dzs[i])
            gemm.bmm(gs[i].transpose(1, 2), dz, out=grad_buffer(w))
            torch.sum(dz, 1, keepdim=True, out=grad_buffer(stack.biases[i]))
            if i:
                dg = gemm.bmm(dz, w.transpose(1, 2))

    def _one_critic_backward(self, c: int, hs: list[torch.Tensor], dq_w: torch.Tensor, dzs: list[torch.Tensor]
                             ) -> torch.Tensor:
        """The gradient in the actions ``[N, A]`` of critic ``c``'s Q-values on N rows whose hidden activations are
        ``hs`` (``[N, width]`` a layer), ``dq_w`` the Q-values' gradient times the output weights (``[1, width]``:
        the same for every row), its weights fixed; ``dzs``: where each layer's pre-activation gradient goes."""
        stack = self.critics
        dg = dq_w.expand(len(hs[-1]), -1)
        for i in range(len(stack.weights) - 1, -1, -1):
            dz = act_backward(self.relu, dg, hs[i], dzs[i])
            w = stack.weights[i][c]
            dg = gemm.mm(dz, (w if i else w[int(w.shape[0]) - self.act_dim :]).t())
        return dg

    def _actor_backward(self, hs: list[torch.Tensor], d_out: torch.Tensor) -> None:
        torch.mm(d_out.t(), hs[-1], out=grad_buffer(self.head.weight))
        torch.sum(d_out, 0, out=grad_buffer(self.head.bias))
        self.actor.backward(hs, d_out, self.head.weight, "actor")


class TwinQGrad(ActorCriticGrad):
    """SAC's update in its two stages (the module docstring): ``critic_gradient``, the critics' step, then
    ``actor_gradient``."""

    def __init__(self, model: TwinQModel, target: Any) -> None:
        super().__init__(model, target)
        # what the critic stage keeps for the actor stage: obs, the actor's activations at s, the samples, B
        self._pending: tuple[torch.Tensor, list[torch.Tensor], _Sample, int] | None = None

    @staticmethod
    def _sample(out: torch.Tensor, n: int, generator: torch.Generator) -> _Sample:
        """``SquashedGaussian(out).sample_logp(generator)`` on the actor's outputs at s' then at s (``n``
        rows each, the noise ``draw_noise``'s); keeps what the backward pass needs."""
        noise = draw_noise(n, out.shape[1] // 2, generator)
        a, logp, std, in_range = squashed_sample(out, noise)
        return _Sample(a, logp, noise, std, in_range)

    def _min_critic_backward(self, gs: list[torch.Tensor], which: torch.Tensor, dq: float) -> torch.Tensor:
        """The gradient of ``dq * min_c Q_c(s, a)`` in the actions ``[B, A]``, the critics' weights fixed:
        each row back-propagated only through the critic that is its minimum (the others' gradient there
        is zero), which halves the products of a pass of every row through every critic."""
        stack = self.critics
        da = torch.empty(gs[0].shape[1], self.act_dim)
        for c in range(stack.num):
            rows = (which == c).nonzero().squeeze(1)
            if not len(rows):
                continue
            hs = [g[c].index_select(0, rows) for g in gs[1:]]
            da.index_copy_(0, rows, self._one_critic_backward(c, hs, dq * stack.out_weight[c], hs))  # dz in place
        return da

    # ------------------------------------------------------------------ the update, in two stages
    @torch.no_grad()
    def critic_gradient(self, batch: dict[str, torch.Tensor], columns: tuple[str, str, str, str, str],
                        alpha: torch.Tensor, generator: torch.Generator) -> CriticStep:
        """The critic stage: set the critics' ``.grad`` to the gradient of ``sac_critic_loss`` on ``batch``.
        ``columns``: the batch's keys of obs, actions, n-step next obs, n-step rewards, n-step discounts. It
        also samples the actor at s for the actor stage (the actor does not change between the stages)."""
        obs_k, act_k, next_k, rew_k, disc_k = columns
        obs, next_obs = batch[obs_k], batch[next_k]
        n = len(obs)
        # the actor at s' and at s in one pass of 2n rows (one call a layer and one sampling, not two), its
        # samples drawn as sac_loss's stages draw them: at s' first, then at s
        hs, out = self._actor(torch.cat([flat(next_obs), flat(obs)]), "actor")
        both = self._sample(out, n, generator)
        # the target
        _, q_target = self._critic(self.target_critics, self._sa(next_obs, both.a[:n]), "target")
        q_next = q_target.amin(0) - alpha * both.logp[:n]
        target = torch.addcmul(batch[rew_k], batch[disc_k], q_next)
        # critics
        gs, q = self._critic(self.critics, self._sa(obs, self.model.to_unit(batch[act_k])), "critic")
        err = q - target
        critic = 0.5 * err.pow(2).mean(-1).sum()
        self._critic_backward(gs, err.div_(n))
        self._pending = (obs, [h[n:] for h in hs], both, n)
        return CriticStep(critic, q.mean(), target.mean())

    @torch.no_grad()
    def actor_gradient(self, alpha: torch.Tensor, log_alpha: torch.Tensor | None, target_entropy: float) -> ActorStep:
        """The actor stage, after ``critic_gradient`` and the critics' step: set the actor's ``.grad`` (and
        ``log_alpha``'s when the temperature is learned) to the gradient of ``sac_actor_loss``, its sample at s
        passed through the stepped critics."""
        if self._pending is None:
            raise RuntimeError("TwinQGrad.actor_gradient runs after critic_gradient, on the same minibatch")
        obs, hs, both, n = self._pending
        self._pending = None
        a_cur, logp = both.a[n:], both.logp[n:]
        gs_pi, q_pi = self._critic(self.critics, self._sa(obs, a_cur), "actor_q")
        q_min, which = q_pi.min(0)
        actor = (alpha * logp - q_min).mean()
        alpha_loss = torch.zeros(())
        if log_alpha is not None:
            alpha_loss = -(log_alpha * (logp + target_entropy)).mean()
            log_alpha.grad = -(logp + target_entropy).mean()
        da = self._min_critic_backward(gs_pi, which, -1.0 / n)
        # a = tanh(u), u = mean + std * noise; d logp / d log_std = -1 (plus u's)
        scale = alpha / n
        # d logp / da = 2a / (1 - a^2 + eps) (the tanh correction's form, SquashedGaussian.TANH_EPS), then through
        # tanh by the kernel autograd's backward uses: 1 - a^2 cancels near |a| = 1, and computed another way
        # it rounds differently there
        g_a = da + (2.0 * scale) * a_cur / (1.0 - a_cur.pow(2) + SquashedGaussian.TANH_EPS)
        du = torch.ops.aten.tanh_backward(g_a, a_cur)
        d_log_std = (du * both.noise[n:] * both.std[n:] - scale) * both.in_range[n:]
        self._actor_backward(hs, torch.cat([du, d_log_std], dim=-1))  # the rows at s
        return ActorStep(actor, alpha_loss, -logp.mean())
