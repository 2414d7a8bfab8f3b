"""Policy: how an agent acts and learns = model + action distribution + loss + learner state.

A Policy is built from its algorithm's hooks (``rlrun.algos.algorithm.Algorithm``: postprocess, action
hook, learner-state factory), a loss function and a ``PolicySpec`` (spaces + typed configs); no
classes are generated at run time. A loss is ``loss_fn(policy, model, dist_class, train_batch) ->
LossOutput`` where ``train_batch`` maps column names to torch tensors (one minibatch); it reads typed
settings with ``policy.config_as(PPOConfig)``, ``policy.loss_config_as(...)`` and
``policy.state_as(KLState)``. The optimizer step lives in one place: ``step_gradients`` (after autograd's
``backward`` in ``apply_gradients``, or after an algorithm's ``hand_gradient`` for a loss and model it knows),
once per stage of a ``StagedLoss`` this update takes (``loss.py``: SAC's and TD3's critics step before the
actor's term is computed). Workers and the learner hold a policy map ``{policy_id: Policy}``; single-agent runs
have one, ``default_policy``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.config.schemas import AlgoConfig, LossConfig, ModelConfig
from rlrun.core.errors import NonFiniteLossError as NonFiniteLossError  # re-exported
from rlrun.core.errors import PluginError
from rlrun.core.metrics import DEFAULT_POLICY_ID as DEFAULT_POLICY_ID  # re-exported
from rlrun.core.registry import DISTRIBUTIONS
from rlrun.data.batch import SampleBatch
from rlrun.data.postprocessing import clip_rewards, explained_variance, piecewise
from rlrun.envs.filters import NoFilter, make_filter
from rlrun.models.action_mask import build_model
from rlrun.models.check import check_model_output
from rlrun.models.distributions import ActionDistribution, model_distribution
from rlrun.models.numpy_actor import NumpyActor
from rlrun.models.sequences import SEQ_ROWS, SequenceView, sequence_minibatch, sequence_minibatches, sequence_starts
from rlrun.policy.loss import GradientFn as GradientFn  # re-exported
from rlrun.policy.loss import HandGradient as HandGradient
from rlrun.policy.loss import LossOutput as LossOutput
from rlrun.policy.loss import TorchBatch as TorchBatch
from rlrun.policy.loss import as_float, checked_total, non_finite, stages_of
from rlrun.policy.optim import Groups, Optimizer, make_optimizer, set_lr

# Batches that come through Ray's object store are read-only numpy views; learning only reads them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class ActionOutput(NamedTuple):
    actions: np.ndarray  # [B, *action_shape], unclipped samples (what logp refers to)
    logp: np.ndarray  # [B] float32
    values: np.ndarray  # [B] float32
    dist_inputs: np.ndarray  # [B, num_outputs] float32
    state_out: list[np.ndarray] | None = None  # recurrent models: the state after this step, per tensor [B, ...]


LossFn = Callable[["Policy", nn.Module, type[ActionDistribution], TorchBatch], LossOutput]
# (policy, time-major fragment [T, B], last_values [B]) -> fragment with extra columns
PostprocessFn = Callable[["Policy", SampleBatch, np.ndarray], SampleBatch]
# (policy, obs [B, ...], explore) -> actions; replaces sampling from the action distribution
ActionFn = Callable[["Policy", np.ndarray, bool], ActionOutput]
C = TypeVar("C")


class LearnerState(Protocol):
    """An algorithm's per-policy learning state (a KL coefficient, a target network, a replay
    buffer). The policy owns it; the algorithm's hooks update it; checkpoints store ``get_state``."""

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]: ...

    def set_state(self, state: Mapping[str, Any]) -> None: ...


class NoState:
    """The learner state of algorithms that keep none (PG, A2C)."""

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        pass


StateFn = Callable[["Policy"], LearnerState]


def no_state(policy: Policy) -> LearnerState:
    return NoState()


class PolicyHooks(Protocol):
    """What a Policy takes from its algorithm (``rlrun.algos.algorithm.Algorithm`` has these fields)."""

    @property
    def name(self) -> str: ...
    @property
    def postprocess(self) -> PostprocessFn | None: ...
    @property
    def compute_actions(self) -> ActionFn | None: ...
    @property
    def make_state(self) -> StateFn: ...
    @property
    def needs_next_obs(self) -> bool: ...
    @property
    def bootstrap_values(self) -> bool: ...
    @property
    def hand_gradient(self) -> Callable[[Policy], HandGradient | None] | None: ...


@dataclass
class PolicySpec:
    """Everything needed to build a Policy anywhere (in-process or in a remote worker): plain data."""

    obs_space: gym.Space
    action_space: gym.Space
    algo: AlgoConfig
    loss: LossConfig
    model: ModelConfig
    seed: int = 0
    observation_filter: str = "none"  # rollout.observation_filter: none | mean_std
    observation_filter_clip: float = 10.0


class Policy:
    """A torch policy: one model, one action distribution class, one loss, one optimizer."""

    def __init__(self, spec: PolicySpec, hooks: PolicyHooks, loss_fn: LossFn,
                 policy_id: str = DEFAULT_POLICY_ID) -> None:
        self.spec = spec
        self.policy_id = policy_id
        self.hooks = hooks
        self.loss_fn = loss_fn
        self.observation_space = spec.obs_space
        self.action_space = spec.action_space
        self.config = spec.algo
        self.loss_config = spec.loss
        dist_name = model_distribution(spec.model, spec.action_space)
        self.dist_class: type[ActionDistribution] = DISTRIBUTIONS.get(dist_name, "model.action_dist")
        num_outputs = self.dist_class.required_inputs(spec.action_space)
        torch.manual_seed(spec.seed)
        self.model: nn.Module = build_model(spec.model.name, spec.obs_space, spec.action_space, num_outputs,
                                            spec.model)  # an action-masked observation: behind MaskedModel
        check_model_output(self.model, spec.obs_space, spec.model.name, num_outputs)
        self.recurrent = bool(getattr(self.model, "is_recurrent", False))
        self._rnn: Any = self.model  # a recurrent model's extra methods (rlrun/models/lstm.py), untyped for nn.Module
        if self.recurrent and not getattr(hooks, "recurrent", True):
            raise PluginError(f"model.name: '{spec.model.name}' is a recurrent model, and algo '{hooks.name}' cannot "
                              "carry its state")
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        opt = spec.algo.optimizer
        self.optimizer: Optimizer = make_optimizer(opt.name, self._params, spec.algo.lr, spec.algo.adam_eps, opt.kwargs)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.np_rng = np.random.default_rng(spec.seed)
        self.global_timestep = 0  # env steps sampled so far (set by the trainer, sent to workers); drives schedules
        self.num_rows_trained = 0  # minibatch rows through SGD so far (time/learn_throughput)
        self.state: LearnerState = hooks.make_state(self)
        # the loss's gradient without autograd, where the algorithm has one for this loss and model (else None)
        self.hand_gradient = hooks.hand_gradient(self) if hooks.hand_gradient is not None else None
        self.stages = stages_of(loss_fn, self.optimizer, self.hand_gradient, spec.loss.name, hooks.name)
        self.obs_filter: NoFilter = make_filter(spec.observation_filter, tuple(spec.obs_space.shape or ()),
                                                spec.observation_filter_clip)
        # the built-in MLP + categorical or Gaussian acts in numpy (1.2-2.7x faster at 64 to 1 rows: numpy_actor.py)
        self._numpy = (NumpyActor(self.model, self.np_rng, gaussian=NumpyActor.kind(self) == "gaussian")
                       if NumpyActor.supports(self) else None)

    @property
    def needs_next_obs(self) -> bool:
        """Workers add a NEXT_OBS column before postprocessing (off-policy algos, V-trace)."""
        return self.hooks.needs_next_obs

    # ------------------------------------------------------------------ typed views
    def config_as(self, cls: type[C]) -> C:
        """``policy.config`` as the algorithm's own schema (e.g. ``PPOConfig``), checked."""
        return _checked(self.config, cls, "algo")

    def loss_config_as(self, cls: type[C]) -> C:
        """``policy.loss_config`` as the loss's own schema (e.g. ``PPOClipLossConfig``), checked."""
        return _checked(self.loss_config, cls, "loss")

    def state_as(self, cls: type[C]) -> C:
        """The learner state as the algorithm's own class (e.g. ``KLState``), checked."""
        return _checked(self.state, cls, "learner state")

    # ------------------------------------------------------------------ acting
    def filter_obs(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        """Raw env observations -> what the model takes (``rollout.observation_filter``). Workers
        update the statistics while sampling; evaluation and exports leave them frozen."""
        return self.obs_filter(obs, update)

    def initial_state(self, batch_size: int) -> list[np.ndarray]:
        """A recurrent model's state at an episode start, ``batch_size`` rows per tensor (else ``[]``)."""
        if not self.recurrent:
            return []
        return [t.numpy() for t in self._rnn.initial_state(batch_size)]

    def compute_actions(self, obs: np.ndarray, explore: bool = True,
                        state: list[np.ndarray] | None = None) -> ActionOutput:
        """Actions for a batch of observations ``[B, *obs_shape]`` in one forward pass; a recurrent
        policy also takes the state before the step (default: an episode start) and returns the next."""
        if self.hooks.compute_actions is not None:
            return self.hooks.compute_actions(self, obs, explore)
        if self._numpy is not None:
            return ActionOutput(*self._numpy.compute_actions(obs, explore), None)
        new_state = None
        with torch.inference_mode():
            if self.recurrent:
                out, st = self._rnn.forward_step(torch.as_tensor(obs), self._state_tensors(state, len(obs)))
                new_state = [t.numpy() for t in st]
            else:
                out = self.model(torch.as_tensor(obs))
            dist = self.dist_class(out.dist_inputs)
            actions = dist.sample(self.generator) if explore else dist.deterministic_sample()
            logp = dist.logp(actions)
        return ActionOutput(actions.numpy(), logp.detach().numpy(), out.values.detach().numpy(),
                            out.dist_inputs.detach().numpy(), new_state)

    def logp_of(self, dist_inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The log-probabilities of ``actions`` under the distributions ``dist_inputs`` describe."""
        if self._numpy is not None:
            return self._numpy.logp_of(dist_inputs, actions)
        with torch.inference_mode():
            return self.dist_class(torch.as_tensor(dist_inputs)).logp(torch.as_tensor(actions)).numpy()

    def reseed(self, seed: int) -> None:
        """Restart the action-sampling and minibatch generators from ``seed`` (in place: the numpy
        actor keeps using the same generator object)."""
        self.generator.manual_seed(seed)
        self.np_rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state

    def compute_values(self, obs: np.ndarray, state: list[np.ndarray] | None = None) -> np.ndarray:
        if self._numpy is not None:
            return self._numpy.forward(obs)[1]
        with torch.inference_mode():
            if self.recurrent:
                return self._rnn.forward_step(torch.as_tensor(obs), self._state_tensors(state, len(obs)))[0] \
                    .values.detach().numpy()
            return self.model(torch.as_tensor(obs)).values.detach().numpy()

    def _state_tensors(self, state: list[np.ndarray] | None, n: int) -> list[torch.Tensor]:
        return self._rnn.initial_state(n) if state is None else [torch.as_tensor(s) for s in state]

    def postprocess_trajectory(self, fragment: SampleBatch, last_values: np.ndarray) -> SampleBatch:
        """Add advantage/target columns to a time-major fragment (columns ``[T, B, ...]``); with
        ``algo.clip_rewards`` the learner sees each reward's sign (true) or the reward clipped to [-c, c]
        (a number c); the episode returns were summed from the env's rewards before."""
        if self.config.clip_rewards is not False and SampleBatch.REWARDS in fragment:
            fragment[SampleBatch.REWARDS] = clip_rewards(fragment[SampleBatch.REWARDS], self.config.clip_rewards)
        fn = self.hooks.postprocess
        return fragment if fn is None else fn(self, fragment, last_values)

    # ------------------------------------------------------------------ learning
    def current_lr(self) -> float:
        sched = self.config.lr_schedule
        return piecewise(sched, self.global_timestep) if sched else self.config.lr

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """``num_sgd_iter`` passes over ``batch`` in minibatches; returns averaged stats."""
        stats = self.learn_on_minibatches(self._minibatches(batch))
        if SampleBatch.VF_PREDS in batch and SampleBatch.VALUE_TARGETS in batch:
            stats["train/explained_variance"] = explained_variance(
                batch[SampleBatch.VF_PREDS], batch[SampleBatch.VALUE_TARGETS]
            )
        return stats

    def learn_on_minibatches(self, minibatches: Iterable[TorchBatch]) -> dict[str, float]:
        """One optimizer step per minibatch at the current learning rate; the steps' averaged stats."""
        lr = self.current_lr()
        set_lr(self.optimizer, lr)
        if not self.model.training:  # Module.train() walks every submodule: ~0.1 ms of a 1:1-cadence round
            self.model.train()
        per_step = [self.learn_on_minibatch(mbatch, lr) for mbatch in minibatches]
        stats = average_stats(per_step)
        stats["train/lr"] = lr
        stats["train/num_sgd_steps"] = float(len(per_step))
        return stats

    def _minibatches(self, batch: SampleBatch) -> Iterator[TorchBatch]:
        """``num_sgd_iter`` epochs of shuffled ``sgd_minibatch_size`` minibatches (the whole batch
        at once, unshuffled, when the minibatch size is the batch). A recurrent policy's minibatches
        are whole sequences (rlrun/models/sequences.py)."""
        tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items() if v.dtype != object}
        n = len(batch)
        mb = self.config.sgd_minibatch_size or n
        if self.recurrent:
            yield from self._sequence_minibatches(batch, tb, mb)
            return
        for _ in range(self.config.num_sgd_iter):
            if mb >= n:
                yield tb
                continue
            perm = torch.randperm(n, generator=self.generator)
            for start in range(0, n, mb):
                idx = perm[start : start + mb]
                yield {k: v[idx] for k, v in tb.items()}

    def _sequence_minibatches(self, batch: SampleBatch, tb: TorchBatch, mb: int) -> Iterator[TorchBatch]:
        starts, lens = sequence_starts(batch[SampleBatch.EPS_ID], batch[SampleBatch.T], int(self._rnn.max_seq_len))
        for _ in range(self.config.num_sgd_iter):
            for seqs in sequence_minibatches(lens, mb, self.generator, shuffle=mb < len(batch)):
                yield sequence_minibatch(tb, starts, lens, seqs)

    def learn_on_minibatch(self, mbatch: TorchBatch, lr: float | None = None) -> dict[str, float]:
        """One loss evaluation and optimizer step (one a stage, in order, for a ``StagedLoss``); its stats
        (``train/loss/*``, ``train/*``), not averaged."""
        hand = self.hand_gradient if SEQ_ROWS not in mbatch else None
        hands = hand if isinstance(hand, tuple) else (hand,) * len(self.stages)
        model = SequenceView(self.model, mbatch) if SEQ_ROWS in mbatch else self.model
        totals, norms = list[float](), list[float]()
        stats: dict[str, float] = {}
        for (loss_fn, groups, when), fn in zip(self.stages, hands, strict=True):
            if when is not None and not when(self):  # a stage this update skips (TD3's delayed actor)
                continue
            out = fn(mbatch) if fn is not None else loss_fn(self, model, self.dist_class, mbatch)
            total = checked_total(out, self.loss_config.name)
            if not math.isfinite(total):  # stop before the step: the weights stay as they were
                raise non_finite(total, out, groups if totals else None, self.global_timestep,
                                 self.current_lr() if lr is None else lr)
            norms.append(self.step_gradients(groups) if fn is not None else self.apply_gradients(out.total, groups))
            totals.append(total)
            stats.update({f"train/loss/{k}": as_float(v) for k, v in out.terms.items()})
            stats.update({f"train/{k}": as_float(v) for k, v in out.stats.items()})
        stats = {"train/loss/total": math.fsum(totals), "train/grad_norm": math.hypot(*norms), **stats}
        self.num_rows_trained += len(next(iter(mbatch.values()))) if mbatch else 0
        return stats

    def apply_gradients(self, loss: torch.Tensor, groups: tuple[str, ...] | None = None) -> float:
        """zero_grad -> backward -> clip (``grad_clip``) -> step (``groups`` only, if named); the pre-clip norm."""
        self.optimizer.zero_grad()
        loss.backward()
        return self.step_gradients(groups)

    def step_gradients(self, groups: tuple[str, ...] | None = None) -> float:
        """Clip the parameters' gradients (``grad_clip``), then step; returns the pre-clip grad norm. With
        ``groups`` (a staged loss's stage) only those optimizer groups' parameters."""
        opt = self.optimizer
        params, step = (self._params, opt.step) if groups is None or not isinstance(opt, Groups) else (
            opt.params(groups), functools.partial(opt.step, groups))
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            step()
            return 0.0
        # clip_grad_norm_'s arithmetic (the same scale factor, bit for bit) without its multiply by 1 when nothing
        # is clipped: 215 -> 53 us a step for SAC's 12 tensors, ~6 % of an update (experiments/continuous_control)
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        clip = self.config.grad_clip
        if clip is not None:
            coef = clip / (norm + 1e-6)
            if coef < 1.0:
                torch._foreach_mul_(grads, coef)
        step()
        return float(norm)

    # ------------------------------------------------------------------ state
    def get_weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        # torch.tensor copies: weights from Ray's object store are read-only views
        self.model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        """Weights, optimizer, counters, RNGs and the learner state: tensors and plain data only
        (``weights_only`` safe). ``include_buffers``: also replay buffers (large)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "global_timestep": self.global_timestep,
                "rng": {"torch": self.generator.get_state(), "numpy": self.np_rng.bit_generator.state},
                "learner": self.state.get_state(include_buffers), "obs_filter": self.obs_filter.get_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_timestep = int(state["global_timestep"])
        self.generator.set_state(state["rng"]["torch"])
        self.np_rng.bit_generator.state = state["rng"]["numpy"]
        self.state.set_state(state.get("learner") or {})
        self.obs_filter.set_state(state.get("obs_filter") or {})


PolicyMap = dict[str, Policy]  # policy id -> Policy, on every worker and on the learner


def average_stats(per_step: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each statistic over the steps that reported it (one dict per SGD step)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for stats in per_step:
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + 1
    return {k: v / counts[k] for k, v in sums.items()}


def _checked(obj: Any, cls: type[C], what: str) -> C:
    if not isinstance(obj, cls):
        raise TypeError(f"{what} is a {type(obj).__name__}, this code needs a {cls.__name__}")
    return obj
