"""DQN / Simple Q (Mnih et al. 2015) with the usual options: double Q (van Hasselt et al. 2016),
dueling heads (Wang et al. 2016), n-step returns, Huber TD loss, epsilon-greedy exploration.

Dataflow per iteration: sample ``train_batch_size`` env steps (n-step targets computed on the
worker) -> add to the replay buffer -> once ``learning_starts`` steps are stored, do
``training_intensity x env steps / sgd_minibatch_size`` SGD steps on uniform replay minibatches
-> copy the online net to the target net every ``target_network_update_freq`` env steps.
The target network and the replay buffer are the policy's learner state (``DQNState``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, LearnContext, register_algorithm
from rlrun.config.schemas import AlgoConfig, LossConfig
from rlrun.core.registry import LOSSES, MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import add_nstep, piecewise
from rlrun.data.replay import ReplayBuffer, replay_checkpoint, restore_replay
from rlrun.models.base import (
    _ACT_FNS,
    ACTIVATIONS,
    MLPConfig,
    ModelOutput,
    _init,
    _mlp,
    check_mlp_config,
    linear_layers,
    mlp_forward,
)
from rlrun.models.distributions import ActionDistribution
from rlrun.models.numpy_actor import NumpyQ
from rlrun.policy.policy import ActionOutput, LearnerState, LossOutput, Policy, TorchBatch


@dataclass
class DQNConfig(AlgoConfig):
    name: str = "dqn"
    lr: float = 1e-3
    gamma: float = 0.99
    grad_clip: float | None = 10.0
    adam_eps: float = 1e-8
    train_batch_size: int = 256  # env steps sampled per iteration
    sgd_minibatch_size: int | None = 64  # rows per replay minibatch
    training_intensity: float = 16.0  # replayed rows trained on per env step sampled
    replay_capacity: int = 100_000
    learning_starts: int = 1000  # env steps in the buffer before the first SGD step
    target_network_update_freq: int = 500  # env steps between target-network copies
    n_step: int = 1
    double_q: bool = True
    # epsilon-greedy schedule, piecewise linear in env steps: [[0, 1.0], [10000, 0.05]]
    epsilon: list[list[float]] = field(default_factory=lambda: [[0.0, 1.0], [10_000.0, 0.05]])


@dataclass
class DQNLossConfig(LossConfig):
    name: str = "dqn_td"
    huber_delta: float = 1.0  # Huber loss threshold; 0 = plain squared error


@dataclass
class QMLPConfig(MLPConfig):
    name: str = "q_mlp"
    hiddens: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    dueling: bool = False  # Q = V + A - mean(A)
    free_log_std: bool = False  # unused: Q-values have no Gaussian head


@MODELS.register("q_mlp", config=QMLPConfig, validate=check_mlp_config)
class QMLPModel(nn.Module):
    """Q-network: ``dist_inputs`` are Q-values ``[B, num_actions]``, ``values`` = max_a Q."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, config: QMLPConfig) -> None:
        super().__init__()
        sizes = [int(np.prod(obs_space.shape or (1,))), *config.hiddens]
        self.torso = _mlp(sizes, ACTIVATIONS[config.activation])
        self.adv_head = _init(nn.Linear(sizes[-1], num_outputs), 0.01)
        self.v_head = _init(nn.Linear(sizes[-1], 1), 1.0) if config.dueling else None
        self._act = _ACT_FNS[config.activation]
        self._layers = linear_layers(self.torso)

    def forward(self, obs: torch.Tensor) -> ModelOutput:
        h = mlp_forward(self._layers, self._act, obs.reshape(obs.shape[0], -1).float())
        q = F.linear(h, self.adv_head.weight, self.adv_head.bias)
        if self.v_head is not None:
            q = F.linear(h, self.v_head.weight, self.v_head.bias) + q - q.mean(dim=-1, keepdim=True)
        return ModelOutput(q, q.max(dim=-1).values)


@dataclass
class DQNState:
    """One DQN policy's learner state: target network, replay buffer, target-update bookkeeping."""

    target_model: nn.Module
    replay: ReplayBuffer
    last_target_update: int = 0  # env step of the last copy online -> target
    num_target_updates: int = 0
    actor: NumpyQ | None = None  # acting in numpy (built-in q_mlp only); not learner state to save

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        return {"target_model": self.target_model.state_dict(), "last_target_update": self.last_target_update,
                "num_target_updates": self.num_target_updates, **replay_checkpoint(self.replay, include_buffers)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self.target_model.load_state_dict(state["target_model"])
        self.last_target_update = int(state["last_target_update"])
        self.num_target_updates = int(state["num_target_updates"])
        restore_replay(self.replay, state)


def dqn_state(policy: Policy) -> LearnerState:
    """A frozen copy of the online net as target; an empty replay buffer (allocated on first add)."""
    cfg = policy.config_as(DQNConfig)
    target = copy.deepcopy(policy.model).requires_grad_(False)
    actor = NumpyQ(policy.model) if type(policy.model) is QMLPModel and NumpyQ.supports(policy.model) else None
    return DQNState(target, ReplayBuffer(cfg.replay_capacity, policy.spec.seed), actor=actor)


def epsilon(policy: Policy) -> float:
    return piecewise(policy.config_as(DQNConfig).epsilon, policy.global_timestep)


def dqn_actions(policy: Policy, obs: np.ndarray, explore: bool) -> ActionOutput:
    """Greedy in Q, or uniformly random with probability epsilon (explore only)."""
    actor = policy.state.actor if isinstance(policy.state, DQNState) else None
    if actor is not None:  # the built-in q_mlp: numpy on views of its weights
        q = actor.q_values(obs)
    else:
        with torch.inference_mode():
            q = policy.model(torch.as_tensor(obs)).dist_inputs.detach().numpy()
    actions = q.argmax(axis=-1)
    if explore:
        rand = policy.np_rng.random(len(actions)) < epsilon(policy)
        actions = np.where(rand, policy.np_rng.integers(0, q.shape[-1], len(actions)), actions)
    zeros = np.zeros(len(actions), dtype=np.float32)
    return ActionOutput(actions.astype(np.int64), zeros, q.max(axis=-1), q)


def dqn_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """n-step rewards and discounts, and the observation n steps later (``add_nstep``)."""
    cfg = policy.config_as(DQNConfig)
    return add_nstep(fragment, cfg.n_step, cfg.gamma)


@LOSSES.register(
    "dqn_td", config=DQNLossConfig,
    requires=(SB.OBS, SB.ACTIONS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT),
    terms=("td",), stats=("q_mean", "target_mean", "epsilon"),
)
def dqn_td_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    """Huber(Q(s, a) - [R_n + gamma^n Q_target(s', argmax_a' Q(s', a'))]) (double Q) or max_a' Q_target."""
    c = policy.loss_config_as(DQNLossConfig)
    cfg = policy.config_as(DQNConfig)
    obs, next_obs = batch[SB.OBS], batch[SB.NSTEP_NEXT_OBS]
    q = model(obs).dist_inputs
    if cfg.double_q:  # the online net's choice at s', outside autograd: backward runs over obs's rows only
        with torch.no_grad():
            q_next_online = model(next_obs).dist_inputs
    q_sa = q.gather(-1, batch[SB.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        q_next_target = batch.get(TARGET_Q_NEXT)  # dqn_learn computes it for all its minibatches at once
        if q_next_target is None:
            q_next_target = policy.state_as(DQNState).target_model(next_obs).dist_inputs
        if cfg.double_q:
            q_next = q_next_target.gather(-1, q_next_online.argmax(-1, keepdim=True)).squeeze(-1)
        else:
            q_next = q_next_target.max(-1).values
        target = batch[SB.NSTEP_REWARDS] + batch[SB.NSTEP_DISCOUNT] * q_next
    squared = c.huber_delta <= 0
    td = 0.5 * (q_sa - target).pow(2).mean() if squared else F.huber_loss(q_sa, target, delta=c.huber_delta)
    return LossOutput(td, {"td": td}, {"q_mean": q_sa.detach().mean(), "target_mean": target.mean(),
                                       "epsilon": epsilon(policy)})


REPLAY_COLUMNS = (SB.OBS, SB.ACTIONS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT)
TARGET_Q_NEXT = "target_q_next"  # the target net's Q-values of NSTEP_NEXT_OBS (dqn_learn's minibatches)


def replay_minibatches(state: DQNState, size: int, steps: int) -> Iterator[TorchBatch]:
    """``steps`` minibatches of ``size`` replayed rows, drawn in one go, and the target net's Q-values
    for all of them in one forward pass: the target net does not change during these steps. The
    losses are the ones per-minibatch draws gave (same rows, same values); the learner step is only
    ~3% faster on ``dqn_cartpole``, whose 256x256 net makes each SGD step compute-bound (~3 ms).
    What did pay: the loss's double-Q pass over s' runs outside autograd, so backward covers the
    minibatch's own rows only (one iteration's 64 steps: 183 -> 155 ms, 3 interleaved pairs)."""
    rows = state.replay.sample(size * steps)
    tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items()}
    with torch.no_grad():
        tb[TARGET_Q_NEXT] = state.target_model(tb[SB.NSTEP_NEXT_OBS]).dist_inputs
    for i in range(steps):
        yield {k: v[i * size : (i + 1) * size] for k, v in tb.items()}


def dqn_learn(policy: Policy, batch: SB, ctx: LearnContext) -> dict[str, float]:
    """Store the batch; replay ``training_intensity x len(batch)`` rows in minibatches once
    ``learning_starts`` rows are stored; copy online -> target every ``target_network_update_freq``."""
    cfg = policy.config_as(DQNConfig)
    state = policy.state_as(DQNState)
    state.replay.add(SB({k: batch[k] for k in REPLAY_COLUMNS}))
    stats: dict[str, float] = {}
    if len(state.replay) >= cfg.learning_starts:
        mb = cfg.sgd_minibatch_size or 64
        steps = max(1, round(cfg.training_intensity * len(batch) / mb))
        stats = policy.learn_on_minibatches(replay_minibatches(state, mb, steps))
    if ctx.timesteps_total - state.last_target_update >= cfg.target_network_update_freq:
        state.target_model.load_state_dict(policy.model.state_dict())
        state.last_target_update = ctx.timesteps_total
        state.num_target_updates += 1
    stats["train/replay_size"] = float(len(state.replay))
    stats["train/num_target_updates"] = float(state.num_target_updates)
    return stats


DQN = register_algorithm(Algorithm(
    "dqn", DQNConfig, default_loss="dqn_td", postprocess=dqn_postprocess, compute_actions=dqn_actions,
    make_state=dqn_state, learn=dqn_learn, needs_next_obs=True,
    provides_columns=(*COLLECTED_COLUMNS, SB.NEXT_OBS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT),
    metrics=("train/replay_size", "train/num_target_updates"),
    description="DQN with double Q, dueling heads, n-step returns",
))
