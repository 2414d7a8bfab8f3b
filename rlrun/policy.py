"""Policy: how an agent acts and learns = model + action distribution + loss function.

``build_policy(name, loss_fn=..., postprocess_fn=..., stats_fn=...)`` returns a Policy class, so a
new algorithm's learning rule is a plain function, not a subclass. A loss is
``loss_fn(policy, model, dist_class, train_batch) -> LossOutput`` where ``train_batch`` maps column
names to torch tensors (one minibatch). The optimizer step lives in one place: ``apply_gradients``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.batch import SampleBatch
from rlrun.config import AlgoConfig, LossConfig, ModelConfig
from rlrun.distributions import ActionDistribution, default_distribution
from rlrun.errors import NonFiniteLossError  # re-exported
from rlrun.optim import Adam
from rlrun.postprocessing import explained_variance
from rlrun.registry import DISTRIBUTIONS, MODELS

TorchBatch = dict[str, torch.Tensor]
# Batches that come through Ray's object store are read-only numpy views; learning only reads them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class LossOutput(NamedTuple):
    """A loss's result: the scalar to minimise, its named terms (logged as ``loss/<name>``) and
    extra statistics (logged as ``train/<name>``)."""

    total: torch.Tensor
    terms: Mapping[str, torch.Tensor | float] = {}
    stats: Mapping[str, torch.Tensor | float] = {}


class ActionOutput(NamedTuple):
    actions: np.ndarray  # [B, *action_shape], unclipped samples (what logp refers to)
    logp: np.ndarray  # [B] float32
    values: np.ndarray  # [B] float32
    dist_inputs: np.ndarray  # [B, num_outputs] float32


LossFn = Callable[["Policy", nn.Module, type[ActionDistribution], TorchBatch], LossOutput]
# (policy, time-major fragment [T, B], last_values [B]) -> fragment with extra columns
PostprocessFn = Callable[["Policy", SampleBatch, np.ndarray], SampleBatch]
StatsFn = Callable[["Policy", SampleBatch], dict[str, float]]
# (policy, obs [B, ...], explore) -> actions; replaces sampling from the action distribution
ActionFn = Callable[["Policy", np.ndarray, bool], "ActionOutput"]
InitFn = Callable[["Policy"], None]  # called at the end of Policy.__init__ (e.g. build a target network)


@dataclass
class PolicySpec:
    """Everything needed to build a Policy anywhere (in-process or in a remote worker): plain data."""

    obs_space: gym.Space
    action_space: gym.Space
    algo: AlgoConfig
    loss: LossConfig
    model: ModelConfig
    seed: int = 0


class Policy:
    """A torch policy. Subclasses are made by ``build_policy``; they set the three class functions."""

    name: ClassVar[str] = "policy"
    loss_fn: ClassVar[LossFn]
    postprocess_fn: ClassVar[PostprocessFn | None] = None
    stats_fn: ClassVar[StatsFn | None] = None
    action_fn: ClassVar[ActionFn | None] = None
    init_fn: ClassVar[InitFn | None] = None
    needs_next_obs: ClassVar[bool] = False  # workers add a NEXT_OBS column before postprocessing

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.observation_space = spec.obs_space
        self.action_space = spec.action_space
        self.config = spec.algo
        self.loss_config = spec.loss
        dist_name = getattr(spec.model, "action_dist", None) or default_distribution(spec.action_space)
        self.dist_class: type[ActionDistribution] = DISTRIBUTIONS.get(dist_name, "model.action_dist")
        num_outputs = self.dist_class.required_inputs(spec.action_space)
        torch.manual_seed(spec.seed)
        self.model: nn.Module = MODELS.get(spec.model.name)(
            spec.obs_space, spec.action_space, num_outputs, spec.model
        )
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = Adam(self._params, lr=spec.algo.lr, eps=spec.algo.adam_eps)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.np_rng = np.random.default_rng(spec.seed)
        self.global_timestep = 0  # env steps sampled so far; drives schedules
        if type(self).init_fn is not None:
            type(self).init_fn(self)  # type: ignore[misc]

    # ------------------------------------------------------------------ acting
    def compute_actions(self, obs: np.ndarray, explore: bool = True) -> ActionOutput:
        """Actions for a batch of observations ``[B, *obs_shape]`` in one forward pass."""
        if type(self).action_fn is not None:
            return type(self).action_fn(self, obs, explore)  # type: ignore[misc]
        with torch.inference_mode():
            out = self.model(torch.as_tensor(obs))
            dist = self.dist_class(out.dist_inputs)
            actions = dist.sample(self.generator) if explore else dist.deterministic_sample()
            logp = dist.logp(actions)
        return ActionOutput(actions.numpy(), logp.detach().numpy(), out.values.detach().numpy(),
                            out.dist_inputs.detach().numpy())

    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model(torch.as_tensor(obs)).values.detach().numpy()

    def postprocess_trajectory(self, fragment: SampleBatch, last_values: np.ndarray) -> SampleBatch:
        """Add advantage/target columns to a time-major fragment (columns ``[T, B, ...]``)."""
        fn = type(self).postprocess_fn
        return fragment if fn is None else fn(self, fragment, last_values)

    # ------------------------------------------------------------------ learning
    def current_lr(self) -> float:
        sched = self.config.lr_schedule
        if not sched:
            return self.config.lr
        xs = [p[0] for p in sched]
        ys = [p[1] for p in sched]
        return float(np.interp(self.global_timestep, xs, ys))

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """``num_sgd_iter`` passes over ``batch`` in minibatches; returns averaged stats."""
        lr = self.current_lr()
        self.optimizer.lr = lr
        tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items() if v.dtype != object}
        n = len(batch)
        mb = self.config.sgd_minibatch_size or n
        sums: dict[str, float] = {}
        steps = 0
        self.model.train()
        for _ in range(self.config.num_sgd_iter):
            perm = torch.randperm(n, generator=self.generator) if mb < n else None
            for start in range(0, n, mb):
                if perm is None:
                    mbatch = tb
                else:
                    idx = perm[start : start + mb]
                    mbatch = {k: v[idx] for k, v in tb.items()}
                out = type(self).loss_fn(self, self.model, self.dist_class, mbatch)
                total = float(out.total.detach())
                if not math.isfinite(total):  # stop before the step: the weights stay as they were
                    raise NonFiniteLossError(
                        f"loss/total is {total} at env step {self.global_timestep:,} (algo.lr {lr:g}); the policy was "
                        "not updated. A smaller algo.lr or an algo.grad_clip usually helps"
                    )
                grad_norm = self.apply_gradients(out.total)
                sums["loss/total"] = sums.get("loss/total", 0.0) + total
                for k, v in out.terms.items():
                    _accumulate(sums, f"loss/{k}", v)
                for k, v in out.stats.items():
                    _accumulate(sums, f"train/{k}", v)
                _accumulate(sums, "train/grad_norm", grad_norm)
                steps += 1
        stats = {k: v / steps for k, v in sums.items()}
        stats["train/lr"] = lr
        stats["train/num_sgd_steps"] = float(steps)
        if SampleBatch.VF_PREDS in batch and SampleBatch.VALUE_TARGETS in batch:
            stats["train/explained_variance"] = explained_variance(
                batch[SampleBatch.VF_PREDS], batch[SampleBatch.VALUE_TARGETS]
            )
        if type(self).stats_fn is not None:
            stats.update(type(self).stats_fn(self, batch))  # type: ignore[misc]
        return stats

    def apply_gradients(self, loss: torch.Tensor) -> float:
        """zero_grad -> backward -> clip (``grad_clip``) -> step; returns the pre-clip grad norm."""
        self.optimizer.zero_grad()
        loss.backward()
        clip = self.config.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self._params, clip if clip is not None else float("inf"))
        self.optimizer.step()
        return float(norm)

    # ------------------------------------------------------------------ state
    def get_weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        # torch.tensor copies: weights from Ray's object store are read-only views
        self.model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})

    def get_state(self) -> dict[str, Any]:
        """Weights, optimizer state and counters: tensors and plain numbers only (``weights_only`` safe)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_timestep": self.global_timestep,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_timestep = int(state["global_timestep"])


def _accumulate(sums: dict[str, float], key: str, value: torch.Tensor | float) -> None:
    sums[key] = sums.get(key, 0.0) + float(value.detach() if isinstance(value, torch.Tensor) else value)


def build_policy(
    name: str,
    *,
    loss_fn: LossFn,
    postprocess_fn: PostprocessFn | None = None,
    stats_fn: StatsFn | None = None,
    action_fn: ActionFn | None = None,
    init_fn: InitFn | None = None,
    needs_next_obs: bool = False,
) -> type[Policy]:
    """A Policy class whose learning rule is ``loss_fn`` (functional API, no subclassing needed).

    ``action_fn`` replaces sampling from the action distribution (e.g. epsilon-greedy on Q-values);
    ``init_fn`` runs after construction; ``needs_next_obs`` asks workers for a NEXT_OBS column.
    """
    def static(fn: Any) -> Any:
        return staticmethod(fn) if fn is not None else None

    attrs = {
        "name": name,
        "loss_fn": staticmethod(loss_fn),
        "postprocess_fn": static(postprocess_fn),
        "stats_fn": static(stats_fn),
        "action_fn": static(action_fn),
        "init_fn": static(init_fn),
        "needs_next_obs": needs_next_obs,
    }
    return type(f"{name.title().replace('_', '')}Policy", (Policy,), attrs)
