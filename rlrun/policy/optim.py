"""Optimizers by name: rlrun's fused Adam (the default) or any ``torch.optim`` optimizer.

``algo.optimizer: {name: adam}`` is rlrun's ``Adam`` below; ``{name: SGD, kwargs: {momentum: 0.9}}``
(any class in ``torch.optim``, or a plugin's ``OPTIMIZERS`` entry) works too. The learning rate is
always ``algo.lr`` (and its schedule); ``kwargs`` are checked against the optimizer's signature
before anything runs.

Why an own Adam: ``torch.optim.Optimizer`` imports ``torch._dynamo`` on first use, which costs
~1.3 s of every run's start-up here; a CartPole run trains in ~6 s. This class calls the same fused
CPU kernel that ``torch.optim.Adam(fused=True)`` uses (``torch._fused_adam_``) and falls back to
``torch._foreach`` math where that kernel is missing. Its state is tensors and numbers only
(``weights_only`` safe).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch

from rlrun.core.registry import OPTIMIZERS, RegistryError


class Optimizer(Protocol):
    """What a Policy needs of an optimizer (rlrun's Adam and every ``torch.optim`` class have it)."""

    def zero_grad(self) -> None: ...
    def step(self) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@OPTIMIZERS.register("adam")
class Adam:
    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        # every parameter's step count is a view of one tensor: when all of them got a gradient (the usual
        # case) one add_ advances them all, instead of a _foreach_add_ over 0-dim tensors (3 vs 15 us here)
        self._all_steps = torch.zeros(len(self.params), dtype=torch.float32)
        self.steps = list(self._all_steps.unbind())
        self._fused = hasattr(torch, "_fused_adam_")

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        gs = [p.grad for p in self.params if p.grad is not None]
        if not gs:
            return
        b1, b2 = self.betas
        if len(gs) == len(self.params):
            ps, m, v, st = self.params, self.exp_avg, self.exp_avg_sq, self.steps
            self._all_steps.add_(1.0)  # the fused kernel reads the step count, it does not advance it
        else:
            idx = [i for i, p in enumerate(self.params) if p.grad is not None]
            ps = [self.params[i] for i in idx]
            m = [self.exp_avg[i] for i in idx]
            v = [self.exp_avg_sq[i] for i in idx]
            st = [self.steps[i] for i in idx]
            torch._foreach_add_(st, 1.0)
        if self._fused:
            torch._fused_adam_(ps, gs, m, v, [], st, lr=self.lr, beta1=b1, beta2=b2, weight_decay=0.0,
                               eps=self.eps, amsgrad=False, maximize=False)
            return
        torch._foreach_lerp_(m, gs, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, gs, gs, 1 - b2)
        for p, mi, vi, s in zip(ps, m, v, st, strict=True):
            t = float(s)
            denom = (vi / (1 - b2**t)).sqrt_().add_(self.eps)
            p.addcdiv_(mi, denom, value=-self.lr / (1 - b1**t))

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "exp_avg": [t.clone() for t in self.exp_avg], "exp_avg_sq": [t.clone() for t in self.exp_avg_sq],
                "steps": [t.clone() for t in self.steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(state['exp_avg'])} tensors, the model has {len(self.params)}")
        self.lr, self.eps = float(state["lr"]), float(state["eps"])
        self.betas = (float(state["betas"][0]), float(state["betas"][1]))
        for dst, key in ((self.exp_avg, "exp_avg"), (self.exp_avg_sq, "exp_avg_sq"), (self.steps, "steps")):
            for d, s in zip(dst, state[key], strict=True):
                d.copy_(s)


def optimizer_class(name: str, key: str = "algo.optimizer.name") -> type:
    """A registered optimizer, else the ``torch.optim`` class of that name."""
    if name in OPTIMIZERS:
        return OPTIMIZERS.get(name)
    cls = getattr(torch.optim, name, None)
    if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer):
        return cls
    known = [*OPTIMIZERS.names(), *torch_optimizer_names()]
    from rlrun.core.errors import suggest

    raise RegistryError(f"{key}: unknown optimizer '{name}'{suggest(name, known)}. "
                        f"Known optimizers: {', '.join(known)}")


def torch_optimizer_names() -> list[str]:
    return sorted(n for n, c in vars(torch.optim).items()
                  if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer)


def check_optimizer_kwargs(name: str, kwargs: dict[str, Any], key: str = "algo.optimizer.kwargs") -> None:
    """Refuse keyword arguments the optimizer does not take (``lr`` comes from ``algo.lr``)."""
    params = inspect.signature(optimizer_class(name)).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for k in kwargs:
        if name == "adam" and k == "eps":
            raise RegistryError(f"{key}.eps: rlrun's adam takes its eps from algo.adam_eps")
        if k in ("lr", "params") or (k not in params and not takes_any):
            valid = [p for p in params if p not in ("self", "params", "lr")]
            raise RegistryError(f"{key}.{k}: optimizer '{name}' takes no '{k}' here; its options: {', '.join(valid)}"
                                + (" (the learning rate is algo.lr)" if k == "lr" else ""))


def make_optimizer(name: str, params: Sequence[torch.Tensor], lr: float, eps: float,
                   kwargs: dict[str, Any]) -> Optimizer:
    """The optimizer ``name`` over ``params``; rlrun's Adam takes ``algo.adam_eps`` as its eps."""
    cls = optimizer_class(name)
    if cls is Adam:
        return Adam(params, lr=lr, eps=eps, **kwargs)
    opt: Optimizer = cls(params, lr=lr, **kwargs)
    return opt


class Groups:
    """Several optimizers as one, each over its own parameters with its own learning rate (SAC's
    actor, critics and temperature). A schedule scales every group's rate alike: ``set_lr(lr)``
    gives group i ``lr * ratios[i]``. A group whose parameters got no gradient does not step."""

    def __init__(self, groups: dict[str, tuple[Optimizer, float]]) -> None:
        self.groups = {k: opt for k, (opt, _) in groups.items()}
        self.ratios = {k: r for k, (_, r) in groups.items()}

    def set_lr(self, lr: float) -> None:
        for k, opt in self.groups.items():
            set_lr(opt, lr * self.ratios[k])

    def zero_grad(self) -> None:
        for opt in self.groups.values():
            opt.zero_grad()

    def step(self, names: tuple[str, ...] | None = None) -> None:
        """Step every group, or only those ``names`` (a staged loss's stage)."""
        for k, opt in self.groups.items():
            if names is None or k in names:
                opt.step()

    def params(self, names: tuple[str, ...]) -> list[torch.Tensor]:
        """The parameters of the groups ``names``."""
        return [p for k in names for p in optimizer_params(self.groups[k])]

    def state_dict(self) -> dict[str, Any]:
        return {k: opt.state_dict() for k, opt in self.groups.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.groups):
            raise ValueError(f"optimizer state has groups {sorted(state)}, the policy has {sorted(self.groups)}")
        for k, opt in self.groups.items():
            opt.load_state_dict(state[k])


def set_lr(optimizer: Optimizer, lr: float) -> None:
    """Set the learning rate of rlrun's Adam, of every group of ``Groups`` (scaled) or of every param
    group of a ``torch.optim`` optimizer."""
    if isinstance(optimizer, Groups):
        optimizer.set_lr(lr)
        return
    if isinstance(optimizer, Adam):
        optimizer.lr = lr
        return
    for group in getattr(optimizer, "param_groups", []):
        group["lr"] = lr


def optimizer_params(optimizer: Optimizer) -> list[torch.Tensor]:
    """The parameters an optimizer steps (rlrun's Adam, or any ``torch.optim`` optimizer)."""
    params = getattr(optimizer, "params", None)
    if params is not None:
        return list(params)
    return [p for g in getattr(optimizer, "param_groups", []) for p in g["params"]]
