"""SAC's hand-derived update (``rlrun/models/twin_q_grad.py``) as two pure functions of tensors, compiled by
``torch.compile`` (inductor): ``algo.compile_update: true``.

Why: eager, an update of HalfCheetah's sizes (256-row minibatches, 256x256 nets, two threads) is ~2.4 ms of
matrix products and ~2 ms of ~250 small operator calls between them (elementwise passes, sums, the sample's
log-probability, each one a dispatch). Compiled, the elementwise work between two products is one fused loop
and the products are ``gemm``'s, as in the eager update (``torch_matmul_backend``; oneDNN's through rlrun's own
operator, which inductor calls as it is): a 1:1-cadence round of ``sac_halfcheetah`` took 0.89-0.93x the eager hand
gradient's time on an Intel Xeon (MKL, 2026-12-01) and 0.92x on a Zen 5 EPYC (oneDNN, 2026-12-07; medians of 8
alternating pairs of 256 rounds in one process, experiments/continuous_control/compiled.py), where products of
torch's own (MKL's AVX2 kernels) had made it 1.13x. The cost: a C++ compiler, and ~35 s of compiling once per
process (inductor's cache, ``$TORCHINDUCTOR_CACHE_DIR``, else ``inductor/`` in rlrun's cache dir, makes a
later process's ~8 s). The actor's sample stays the eager code, an opaque custom op in the graph (below).

The arithmetic is ``TwinQGrad``'s, with one difference for a static graph: the actor's term back-propagates
through every critic with the rows another critic is the minimum of masked to zero (``TwinQGrad`` gathers
each critic's rows, which a fixed-shape graph cannot), which adds zeros, not rounding. Inductor's fused loops
round differently from eager kernels; the gradients equal autograd's to float rounding
(tests/test_twin_q_compiled.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch

from rlrun.core.cache import cache_root
from rlrun.core.errors import PluginError, one_line
from rlrun.models import gemm
from rlrun.models.distributions import SquashedGaussian
from rlrun.models.mlp_grad import flat
from rlrun.models.twin_q_grad import ActorStep, CriticStep, TwinQGrad, _Stack, draw_noise, squashed_sample

Stack = tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]  # weights, biases, out w, out b
Torso = tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]  # the actor's, the head last


def _act_back(d: torch.Tensor, h: torch.Tensor, relu: bool) -> torch.Tensor:
    """d(act(z)) -> dz from the activation's output ``h``."""
    return d * (h > 0) if relu else d * (1.0 - h * h)


def _critics(x: torch.Tensor, stack: Stack, relu: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every critic's input and hidden activations ``[C, B, width]`` and Q-values ``[C, B]``."""
    ws, bs, ow, ob = stack
    gs = [x.unsqueeze(0).expand(ws[0].shape[0], *x.shape)]
    for w, b in zip(ws, bs, strict=True):
        gs.append(gemm.baddbmm_act(b, gs[-1], w, relu))
    return gs, (gs[-1] * ow).sum(-1) + ob


def _actor(x: torch.Tensor, torso: Torso, relu: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
    ws, bs, hw, hb = torso
    hs = [x]
    for w, b in zip(ws, bs, strict=True):
        hs.append(gemm.addmm_act(b, hs[-1], w.t(), relu))
    return hs, gemm.addmm_act(hb, hs[-1], hw.t(), None)


@torch.library.custom_op("rlrun::squashed_sample", mutates_args=())
def _squashed_sample(out: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                      torch.Tensor]:
    """The actor's sample and log-probability as the eager update draws them, one opaque call in the compiled
    graph: inductor's tanh (Sleef) and ATen's (MKL) differ by an ulp at ~4 % of inputs, and where an action
    saturates log(1 - a^2 + 1e-6) turns that ulp into up to 0.11 (biased: +0.0065 on average over |u| > 4)."""
    a, logp, std, in_range = squashed_sample(out, noise)
    return a, logp, std, in_range


@_squashed_sample.register_fake
def _(out: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(noise), out.new_empty(len(out)), torch.empty_like(noise), noise.new_empty(
        noise.shape, dtype=torch.bool)


def critic_stage(relu: bool, obs: torch.Tensor, next_obs: torch.Tensor, act: torch.Tensor, rew: torch.Tensor,
                 disc: torch.Tensor, noise: torch.Tensor, alpha: torch.Tensor, torso: Torso, critics: Stack,
                 targets: Stack) -> tuple[Any, ...]:
    """``TwinQGrad.critic_gradient``: the critics' gradients (weights, biases, out weight, out bias), the loss
    and its statistics, and what the actor stage needs (the actor's activations at s, the sample there)."""
    n = obs.shape[0]
    hs, out = _actor(torch.cat([next_obs, obs]), torso, relu)
    a, logp, std, in_range = torch.ops.rlrun.squashed_sample(out, noise)
    _, q_target = _critics(torch.cat([next_obs, a[:n]], -1), targets, relu)
    target = rew + disc * (q_target.amin(0) - alpha * logp[:n])
    gs, q = _critics(torch.cat([obs, act], -1), critics, relu)
    err = q - target
    critic = 0.5 * err.pow(2).mean(-1).sum()
    dq = err / n
    ws = critics[0]
    gw, gb = [torch.empty(0)] * len(ws), [torch.empty(0)] * len(ws)
    g_ow, g_ob = torch.bmm(dq.unsqueeze(1), gs[-1]), dq.sum(1, keepdim=True)
    dg = dq.unsqueeze(-1) * critics[2]
    for i in range(len(ws) - 1, -1, -1):
        dz = _act_back(dg, gs[i + 1], relu)
        gw[i], gb[i] = gemm.bmm(gs[i].transpose(1, 2), dz), dz.sum(1, keepdim=True)
        if i:
            dg = gemm.bmm(dz, ws[i].transpose(1, 2))
    saved = ([h[n:] for h in hs], a[n:], logp[n:], noise[n:], std[n:], in_range[n:])
    return gw, gb, g_ow, g_ob, critic, q.mean(), target.mean(), saved


def actor_stage(relu: bool, obs: torch.Tensor, saved: Any, alpha: torch.Tensor, log_alpha: torch.Tensor,
                target_entropy: float, torso: Torso, critics: Stack) -> tuple[Any, ...]:
    """``TwinQGrad.actor_gradient`` on the stepped critics: the actor's gradients (weights, biases, head weight,
    head bias), the temperature's, the losses and the entropy."""
    hs, a, logp, noise, std, in_range = saved
    n, dims = obs.shape[0], a.shape[1]
    gs, q = _critics(torch.cat([obs, a], -1), critics, relu)
    q_min, which = q.min(0)
    actor = (alpha * logp - q_min).mean()
    alpha_loss = -(log_alpha * (logp + target_entropy)).mean()
    g_log_alpha = -(logp + target_entropy).mean()
    ws = critics[0]
    # d(-mean_b min_c Q_c) / dQ_c: -1/n on the rows critic c is the minimum of, else 0
    dq = (which.unsqueeze(0) == torch.arange(ws[0].shape[0]).unsqueeze(1)).to(q.dtype) * (-1.0 / n)
    dg = dq.unsqueeze(-1) * critics[2]
    for i in range(len(ws) - 1, -1, -1):
        dz = _act_back(dg, gs[i + 1], relu)
        dg = gemm.bmm(dz, (ws[i] if i else ws[0][:, ws[0].shape[1] - dims :]).transpose(1, 2))
    scale = alpha / n
    g_a = dg.sum(0) + (2.0 * scale) * a / (1.0 - a.pow(2) + SquashedGaussian.TANH_EPS)
    du = torch.ops.aten.tanh_backward(g_a, a)
    d_out = torch.cat([du, (du * noise * std - scale) * in_range], -1)
    aw, _, hw, _ = torso
    gw, gb = [torch.empty(0)] * len(aw), [torch.empty(0)] * len(aw)
    g_hw, g_hb = gemm.mm(d_out.t(), hs[-1]), d_out.sum(0)
    dh = gemm.mm(d_out, hw)
    for i in range(len(aw) - 1, -1, -1):
        dz = _act_back(dh, hs[i + 1], relu)
        gw[i], gb[i] = gemm.mm(dz.t(), hs[i]), dz.sum(0)
        if i:
            dh = gemm.mm(dz, aw[i])
    return gw, gb, g_hw, g_hb, g_log_alpha, actor, alpha_loss, -logp.mean()


def compiler_problem() -> str | None:
    """Why inductor cannot compile here (no C++ compiler: ``$CXX``, else ``g++``), else None."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return f"torch.compile needs a C++ compiler and '{cxx}' is not on PATH (set CXX, or algo.compile_update=false)"
    return None


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    # Inductor keeps its cache in <temp dir>/torchinductor_<user> unless told otherwise: rlrun's cache dir
    # instead; its precompiled headers always go there, so none (compiling took 38 s against 32 s with them).
    # Multiply-adds contracted as GCC builds ATen's kernels: the tanh backward's g (1 - a^2) then rounds as theirs
    root = cache_root()
    if root is not None:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, "inductor"))
    options: dict[str, str | int | bool | Callable[..., Any]] = {
        "cpp_cache_precompile_headers": False, "cpp.enable_floating_point_contract_flag": "fast"}
    return torch.compile(fn, fullgraph=True, dynamic=False, options=options)


def _compiled(fn: Callable[..., Any], relu: bool) -> Callable[..., Any]:
    """``fn(relu, ...)`` compiled at its first call (a rollout worker's policy, which never learns, does not
    even import Dynamo); a compiler that fails then says so in one line."""
    compiled: Callable[..., Any] | None = None

    def call(*args: Any) -> Any:
        nonlocal compiled
        if compiled is not None:
            return compiled(relu, *args)
        first = _compile(fn)
        try:
            out = first(relu, *args)
        except Exception as e:
            raise PluginError(f"algo.compile_update: torch.compile could not compile SAC's update ({one_line(e)}); "
                              "algo.compile_update=false runs it eagerly") from e
        compiled = first
        return out

    return call


class CompiledTwinQGrad(TwinQGrad):
    """``TwinQGrad``'s two stages by the compiled ``critic_stage`` and ``actor_stage`` (compiled at the first
    update; another minibatch size compiles again). ``compile=False`` runs the same functions eagerly (tests)."""

    def __init__(self, model: Any, target: Any, compile: bool = True) -> None:
        super().__init__(model, target)
        relu = self.relu
        wrap = _compiled if compile else (lambda fn, relu: lambda *args: fn(relu, *args))
        self._critic_stage, self._actor_stage = wrap(critic_stage, relu), wrap(actor_stage, relu)
        self._saved: tuple[torch.Tensor, Any] | None = None

    def _torso(self) -> Torso:
        layers = self.actor.layers
        return [la.weight for la in layers], [la.bias for la in layers], self.head.weight, self.head.bias

    @staticmethod
    def _stack(s: _Stack) -> Stack:
        return s.weights, s.biases, s.out_weight, s.out_bias

    @torch.no_grad()
    def critic_gradient(self, batch: dict[str, torch.Tensor], columns: tuple[str, str, str, str, str],
                        alpha: torch.Tensor, generator: torch.Generator) -> CriticStep:
        obs_k, act_k, next_k, rew_k, disc_k = columns
        obs, next_obs = flat(batch[obs_k]), flat(batch[next_k])
        n = len(obs)
        noise = draw_noise(n, self.act_dim, generator)  # as TwinQGrad draws it
        unit = self.model.to_unit(batch[act_k])
        gw, gb, g_ow, g_ob, critic, q_mean, target_mean, saved = self._critic_stage(
            obs, next_obs, unit, batch[rew_k].float(), batch[disc_k].float(), noise, alpha, self._torso(),
            self._stack(self.critics), self._stack(self.target_critics))
        stack = self.critics
        for p, g in zip([*stack.weights, *stack.biases, stack.out_weight, stack.out_bias],
                        [*gw, *gb, g_ow, g_ob], strict=True):
            p.grad = g
        self._saved = (obs, saved)
        return CriticStep(critic, q_mean, target_mean)

    @torch.no_grad()
    def actor_gradient(self, alpha: torch.Tensor, log_alpha: torch.Tensor | None, target_entropy: float) -> ActorStep:
        if self._saved is None:
            raise RuntimeError("CompiledTwinQGrad.actor_gradient runs after critic_gradient, on the same minibatch")
        obs, saved = self._saved
        self._saved = None
        log_a = log_alpha.detach() if log_alpha is not None else torch.zeros(())
        gw, gb, g_hw, g_hb, g_log_alpha, actor, alpha_loss, entropy = self._actor_stage(
            obs, saved, alpha, log_a, float(target_entropy), self._torso(), self._stack(self.critics))
        layers = self.actor.layers
        for p, g in zip([*(layer.weight for layer in layers), *(layer.bias for layer in layers), self.head.weight,
                         self.head.bias], [*gw, *gb, g_hw, g_hb], strict=True):
            p.grad = g
        if log_alpha is None:
            return ActorStep(actor, torch.zeros(()), entropy)
        log_alpha.grad = g_log_alpha
        return ActorStep(actor, alpha_loss, entropy)
