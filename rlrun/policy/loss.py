"""A loss's contract: ``loss_fn(policy, model, dist_class, train_batch) -> LossOutput``, and losses in stages.

Most losses are one function: the Policy back-propagates its ``total`` and steps the optimizer once. A
``StagedLoss`` is a sequence of such functions, each naming the optimizer groups (``Groups``: SAC's
``actor``, ``critic``, ``alpha``) that its gradient steps; the Policy computes stage 1, back-propagates it and
steps its groups, then computes stage 2 on the parameters stage 1 moved, and so on. SAC's loss is one: the
critics step first and the actor's term then passes its sample through the updated critics, the order of
Stable-Baselines3's, CleanRL's and TD3's authors' updates (RLlib's SAC computes every term before any step).
TD3's is another, whose actor stage has a ``when``: it runs on every ``policy_delay``-th update only.
Each stage keeps the usual signature, so a user's staged loss is plain loss functions registered as::

    LOSSES.add("my_sac", StagedLoss(Stage(my_critic_loss, ("critic",)),
                                    Stage(my_actor_loss, ("actor",), optional=("alpha",))),
               config=..., requires=..., terms=(...), stats=(...))

``algo.grad_clip`` clips each stage's gradients (those of the groups it steps) on their own, as RLlib clips
per optimizer; ``train/grad_norm`` is the norm over every stage's gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from rlrun.core.errors import NonFiniteLossError, PluginError
from rlrun.models.distributions import ActionDistribution

if TYPE_CHECKING:
    from rlrun.policy.optim import Optimizer

TorchBatch = dict[str, torch.Tensor]


class LossOutput(NamedTuple):
    """A loss's result: the scalar to minimise, its named terms (logged as ``train/loss/<name>``) and
    extra statistics (logged as ``train/<name>``)."""

    total: torch.Tensor
    terms: Mapping[str, torch.Tensor | float] = {}
    stats: Mapping[str, torch.Tensor | float] = {}


# loss_fn(policy, model, dist_class, train_batch): rlrun.policy.policy.LossFn, typed there with its Policy
LossFn = Callable[..., LossOutput]
# a loss's gradient derived by hand for the models it knows: sets each parameter's .grad, returns the loss
GradientFn = Callable[[TorchBatch], LossOutput]
HandGradient = GradientFn | tuple[GradientFn, ...]  # a staged loss's: one GradientFn a stage


class Stage(NamedTuple):
    """One stage of a ``StagedLoss``: a loss function and the optimizer groups its gradient steps;
    ``optional`` ones are stepped where the optimizer has them (SAC's ``alpha``: none with a fixed
    temperature); ``when(policy)``, if given, says whether this update takes the stage at all (TD3's
    delayed actor): a skipped stage computes nothing and steps nothing."""

    loss_fn: LossFn
    groups: tuple[str, ...]
    optional: tuple[str, ...] = ()
    when: Callable[[Any], bool] | None = None


class PolicyStage(NamedTuple):
    """A stage as a Policy runs it: the loss function, the optimizer groups it steps (None: all) and
    ``Stage.when`` (None: every update)."""

    loss_fn: LossFn
    groups: tuple[str, ...] | None
    when: Callable[[Any], bool] | None = None


class StagedLoss:
    """A loss whose stages step in order (module docstring). Called as one function, it is the sum of
    the stages this update takes (``Stage.when``) on the same parameters, with no step between them."""

    def __init__(self, *stages: Stage, doc: str | None = None) -> None:
        if not stages or any(not s.groups for s in stages):
            raise ValueError("a StagedLoss needs at least one stage, each naming the optimizer groups it steps")
        self.stages = stages
        first = stages[0].loss_fn
        self.__module__ = getattr(first, "__module__", __name__)
        self.__doc__ = doc or getattr(first, "__doc__", None)

    def __call__(self, policy: Any, model: nn.Module, dist_class: type[ActionDistribution],
                 batch: TorchBatch) -> LossOutput:
        return merge_outputs([s.loss_fn(policy, model, dist_class, batch) for s in self.stages
                              if s.when is None or s.when(policy)])


def merge_outputs(outs: list[LossOutput]) -> LossOutput:
    """Stages' outputs as one: the totals summed, the terms and statistics side by side."""
    total = outs[0].total
    for o in outs[1:]:
        total = total + o.total
    return LossOutput(total, {k: v for o in outs for k, v in o.terms.items()},
                      {k: v for o in outs for k, v in o.stats.items()})


def stages_of(loss_fn: LossFn, optimizer: Optimizer, hand: HandGradient | None, loss_name: str,
              algo_name: str) -> tuple[PolicyStage, ...]:
    """A policy's stages in order, checked against its optimizer's groups and its hand-derived gradient
    (one function a stage)."""
    if not isinstance(loss_fn, StagedLoss):
        return (PolicyStage(loss_fn, None),)
    known = getattr(optimizer, "groups", None) or {}
    unknown = [g for s in loss_fn.stages for g in s.groups if g not in known]
    if unknown:
        raise PluginError(f"loss.name: loss '{loss_name}' steps optimizer groups {unknown} in stages; algo "
                          f"'{algo_name}' has " + (f"groups {sorted(known)}" if known else "one optimizer"))
    if hand is not None and (not isinstance(hand, tuple) or len(hand) != len(loss_fn.stages)):
        raise PluginError(f"algo '{algo_name}': its hand-derived gradient for loss '{loss_name}' needs one function "
                          f"a stage ({len(loss_fn.stages)})")
    return tuple(PolicyStage(s.loss_fn, (*s.groups, *(g for g in s.optional if g in known)), s.when)
                 for s in loss_fn.stages)


def checked_total(out: object, loss_name: str) -> float:
    """The loss's total as a float, after checking it returned ``LossOutput`` with a scalar total."""
    if not isinstance(out, LossOutput) or not isinstance(out.total, torch.Tensor) or out.total.dim() != 0:
        got = f"a total of shape {tuple(out.total.shape)}" if isinstance(out, LossOutput) and isinstance(
            out.total, torch.Tensor) else f"a {type(out).__name__}"
        raise PluginError(f"loss.name: loss '{loss_name}' returned {got}; a loss returns "
                          "LossOutput(total=<scalar tensor>, terms, stats)")
    return float(out.total.detach())


def non_finite(total: float, out: LossOutput, later_stage: tuple[str, ...] | None, env_step: int,
               lr: float) -> NonFiniteLossError:
    """The error for a loss that is not finite, raised before its step: nothing was updated, or (a
    ``later_stage`` of a staged loss) that stage's groups were not, the stages before it were."""
    name = "+".join(out.terms) if later_stage else "total"
    what = f"its {'/'.join(later_stage)} were not updated" if later_stage else "the policy was not updated"
    return NonFiniteLossError(f"train/loss/{name} is {total} at env step {env_step:,} (algo.lr {lr:g}); {what}. "
                              "A smaller algo.lr or an algo.grad_clip usually helps")


def as_float(value: torch.Tensor | float) -> float:
    """A loss term or statistic as a float (logged)."""
    return float(value.detach() if isinstance(value, torch.Tensor) else value)
