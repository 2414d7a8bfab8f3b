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
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, LearnContext, register_algorithm
from rlrun.config.schemas import AlgoConfig, LossConfig
from rlrun.core.errors import PluginError
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import add_nstep, piecewise
from rlrun.data.prioritized import PrioritizedReplayBuffer
from rlrun.data.replay import ReplayBuffer, replay_checkpoint, replay_steps, restore_replay
from rlrun.envs.action_mask import random_legal_actions
from rlrun.models.action_mask import FLOAT_MIN
from rlrun.models.c51_grad import C51Grad
from rlrun.models.distributions import ActionDistribution
from rlrun.models.noisy import NoisyLinear, shared_noise
from rlrun.models.numpy_actor import NumpyQ
from rlrun.models.q_mlp_grad import QMLPGrad
from rlrun.models.q_networks import QMLPModel
from rlrun.policy.policy import ActionOutput, GradientFn, LearnerState, LossOutput, Policy, TorchBatch


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
    # the same, piecewise linear in env steps, [[0, 16], [40000, 4]]; None: training_intensity throughout
    training_intensity_schedule: list[list[float]] | None = None
    replay_capacity: int = 100_000
    learning_starts: int = 1000  # env steps in the buffer before the first SGD step
    target_network_update_freq: int = 500  # env steps between target-network copies
    n_step: int = 1
    double_q: bool = True
    # epsilon-greedy schedule, piecewise linear in env steps: [[0, 1.0], [10000, 0.05]] (a noisy model
    # explores by its noise instead: no random actions)
    epsilon: list[list[float]] = field(default_factory=lambda: [[0.0, 1.0], [10_000.0, 0.05]])
    # prioritized replay (RLlib's names): rows drawn in proportion to (|TD error| + eps)^alpha, the loss
    # weighted by importance weights (N P(i))^-beta, beta annealed linearly to its final value
    prioritized_replay: bool = False
    prioritized_replay_alpha: float = 0.6
    prioritized_replay_beta: float = 0.4
    final_prioritized_replay_beta: float = 1.0
    prioritized_replay_beta_annealing_timesteps: int = 100_000
    prioritized_replay_eps: float = 1e-6
    # dqn_td on the built-in q_mlp (ReLU or tanh): its gradient derived by hand, not by autograd (the same
    # numbers to float rounding): expected Q-values with plain heads (rlrun/models/q_mlp_grad.py, ~1.2x the
    # updates/s), or C51's atoms with plain or noisy heads (rlrun/models/c51_grad.py)
    hand_gradient: bool = True


@dataclass
class DQNLossConfig(LossConfig):
    name: str = "dqn_td"
    huber_delta: float = 1.0  # Huber loss threshold; 0 = plain squared error


@dataclass
class DQNState:
    """One DQN policy's learner state: target network, replay buffer, target-update bookkeeping."""

    target_model: nn.Module
    replay: ReplayBuffer
    last_target_update: int = 0  # env step of the last copy online -> target
    num_target_updates: int = 0
    actor: NumpyQ | None = None  # acting in numpy (built-in q_mlp only; noise from the policy's np_rng); not state
    noisy: bool = False  # the model has noisy layers: it explores by them, not epsilon-greedy
    target_grad: QMLPGrad | None = None  # the target net's Q-values without autograd (algo.hand_gradient)

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
    replay = (PrioritizedReplayBuffer(cfg.replay_capacity, policy.spec.seed, cfg.prioritized_replay_alpha,
                                      cfg.prioritized_replay_eps)
              if cfg.prioritized_replay else ReplayBuffer(cfg.replay_capacity, policy.spec.seed))
    fast = QMLPGrad(target) if cfg.hand_gradient and QMLPGrad.supports(target, trains=False) else None
    return DQNState(target, replay, actor=actor, noisy=is_noisy(policy.model), target_grad=fast)


def is_noisy(model: nn.Module) -> bool:
    return any(isinstance(m, NoisyLinear) for m in model.modules())


def epsilon(policy: Policy) -> float:
    """The chance of a random action now: 0 for a noisy model, whose noise explores."""
    if isinstance(policy.state, DQNState) and policy.state.noisy:
        return 0.0
    return piecewise(policy.config_as(DQNConfig).epsilon, policy.global_timestep)


def dqn_actions(policy: Policy, obs: np.ndarray, explore: bool) -> ActionOutput:
    """Greedy in Q, or uniformly random with probability epsilon (explore only). A noisy model acts
    greedily in its noisy Q-values to explore, in its mean Q-values otherwise."""
    state = policy.state if isinstance(policy.state, DQNState) else None
    if state is not None and state.actor is not None:  # the built-in q_mlp: numpy on views of its weights
        q = state.actor.q_values(obs, policy.np_rng if explore and state.noisy else None)
    else:
        noisy = state is not None and state.noisy
        if noisy:
            policy.model.train(explore)
        with torch.inference_mode():
            q = policy.model(torch.as_tensor(obs)).dist_inputs.detach().numpy()
        if noisy:
            policy.model.train()
    actions = q.argmax(axis=-1)
    if explore and not (state is not None and state.noisy):
        rand = policy.np_rng.random(len(actions)) < epsilon(policy)
        drawn = random_legal_actions(policy.np_rng, obs, policy.observation_space, q.shape[-1])
        actions = np.where(rand, drawn, actions)
    zeros = np.zeros(len(actions), dtype=np.float32)
    return ActionOutput(actions.astype(np.int64), zeros, q.max(axis=-1), q)


def dqn_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    """n-step rewards and discounts, and the observation n steps later (``add_nstep``)."""
    cfg = policy.config_as(DQNConfig)
    return add_nstep(fragment, cfg.n_step, cfg.gamma)


def project_distribution(probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor,
                         support: torch.Tensor) -> torch.Tensor:
    """C51's projected Bellman target (Bellemare et al. 2017, Algorithm 1): the distribution ``probs``
    ``[B, N]`` over ``support`` ``[N]``, moved to ``rewards + discounts * support`` (clipped to the
    support's range) and split between the two nearest atoms in proportion to closeness. ``[B, N]``."""
    n = support.shape[0]
    v_min, v_max = float(support[0]), float(support[-1])
    dz = (v_max - v_min) / (n - 1)
    tz = (rewards.unsqueeze(-1) + discounts.unsqueeze(-1) * support).clamp(v_min, v_max)
    b = (tz - v_min) / dz  # fractional atom index in [0, n - 1]
    floor = b.floor()
    # an exact atom (b == floor) keeps all of its mass: weight 1 to floor, 0 to floor + 1 (clamped to
    # the last atom); no boolean masks (each a nonzero and an index_put, ~16 us apiece here). Indices are
    # clamped so that a NaN reward gives a NaN loss (stopped before the step), not an indexing error.
    lower = floor.long().clamp_(0, n - 1)
    upper = (lower + 1).clamp_(max=n - 1)
    out = torch.zeros_like(probs)
    out.scatter_add_(-1, lower, probs * ((floor + 1) - b))
    out.scatter_add_(-1, upper, probs * (b - floor))
    return out


def online_outputs(policy: Policy, model: nn.Module, obs: torch.Tensor,
                   next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The online net's output at s, with autograd (the atoms' log-probabilities ``[B, A, N]`` for a
    distributional model, Q-values ``[B, A]`` otherwise), and its Q-values at s' for double Q's choice
    (None without double Q), outside autograd so that backward runs over obs's rows only. Noisy heads: the
    pass at s' reuses the noise of the pass at s (as in Kaixhin's Rainbow; the hand-derived C51 gradient
    runs both as one pass), and both come before the target net's pass."""
    m: Any = model

    def at_s() -> torch.Tensor:
        return m.q_log_probs(obs) if getattr(m, "num_atoms", 1) > 1 else model(obs).dist_inputs

    if not policy.config_as(DQNConfig).double_q:
        return at_s(), None
    with shared_noise(model):
        out = at_s()
        with torch.no_grad():
            q_next = model(next_obs).dist_inputs
    return out, q_next


@LOSSES.register(
    "dqn_td", config=DQNLossConfig,
    requires=(SB.OBS, SB.ACTIONS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT),
    terms=("td",), stats=("q_mean", "target_mean", "epsilon"),
)
def dqn_td_loss(
    policy: Policy, model: nn.Module, dist_class: type[ActionDistribution], batch: TorchBatch
) -> LossOutput:
    """Huber(Q(s, a) - [R_n + gamma^n Q_target(s', argmax_a' Q(s', a'))]) (double Q) or max_a' Q_target.
    A distributional model (``num_atoms > 1``): the cross-entropy of Q(s, a)'s atoms against the
    target's, projected onto the support (C51). Rows are weighted by ``weights`` where the batch has
    them (prioritized replay), and each row's TD error (C51: its cross-entropy) goes into the batch as
    ``td_error`` for the priority update."""
    c = policy.loss_config_as(DQNLossConfig)
    obs, next_obs = batch[SB.OBS], batch[SB.NSTEP_NEXT_OBS]
    m: Any = model
    actions = batch[SB.ACTIONS].long().unsqueeze(-1)
    atoms = getattr(m, "num_atoms", 1)
    target_model: Any = policy.state_as(DQNState).target_model
    out, q_next_online = online_outputs(policy, model, obs, next_obs)
    if atoms > 1:
        log_p_sa = out.gather(1, actions.unsqueeze(-1).expand(-1, 1, atoms)).squeeze(1)
        with torch.no_grad():
            p_next = target_model.q_log_probs(next_obs).exp()
            q_next_target = (p_next * target_model.support).sum(-1)
            best = (q_next_online if q_next_online is not None else q_next_target).argmax(-1)
            p_best = p_next[torch.arange(len(best)), best]
            target_p = project_distribution(p_best, batch[SB.NSTEP_REWARDS], batch[SB.NSTEP_DISCOUNT], m.support)
            target = (target_p * m.support).sum(-1)
        per_row = -(target_p * log_p_sa).sum(-1)
        q_sa = (log_p_sa.detach().exp() * m.support).sum(-1)
        td_error = per_row.detach()
    else:
        q_sa = out.gather(-1, actions).squeeze(-1)
        with torch.no_grad():
            q_next_target = batch.get(TARGET_Q_NEXT)  # dqn_learn computes it for all its minibatches at once
            if q_next_target is None:
                q_next_target = target_model(next_obs).dist_inputs
            if q_next_online is not None:
                q_next = q_next_target.gather(-1, q_next_online.argmax(-1, keepdim=True)).squeeze(-1)
            else:
                q_next = q_next_target.max(-1).values
            q_next = q_next.masked_fill(q_next <= FLOAT_MIN / 2, 0.0)  # an action mask with no legal action: no value
            target = batch[SB.NSTEP_REWARDS] + batch[SB.NSTEP_DISCOUNT] * q_next
        squared = c.huber_delta <= 0
        per_row = (0.5 * (q_sa - target).pow(2) if squared
                   else F.huber_loss(q_sa, target, delta=c.huber_delta, reduction="none"))
        q_sa = q_sa.detach()
        td_error = q_sa - target
    weights = batch.get(SB.WEIGHTS)
    td = (per_row * weights).mean() if weights is not None else per_row.mean()
    batch[SB.TD_ERROR] = td_error
    return LossOutput(td, {"td": td}, {"q_mean": q_sa.mean(), "target_mean": target.mean(),
                                       "epsilon": epsilon(policy)})


def dqn_hand_gradient(policy: Policy) -> GradientFn | None:
    """``dqn_td`` on the built-in ``q_mlp``, its gradient derived by hand: the same target and loss as
    ``dqn_td_loss``, no autograd graph; expected Q-values with plain heads (rlrun/models/q_mlp_grad.py)
    or C51's atoms (``c51_hand_gradient``). None (autograd) for another loss or model (noisy heads
    without atoms included), or with ``algo.hand_gradient: false``."""
    cfg, target_net = policy.config_as(DQNConfig), policy.state_as(DQNState).target_grad
    if cfg.hand_gradient and policy.loss_fn is dqn_td_loss and C51Grad.supports(policy.model):
        return c51_hand_gradient(policy)
    if target_net is None or policy.loss_fn is not dqn_td_loss or not QMLPGrad.supports(policy.model):
        return None  # (target_grad is None with algo.hand_gradient false)
    online, delta = QMLPGrad(policy.model), policy.loss_config_as(DQNLossConfig).huber_delta

    def td_gradient(batch: TorchBatch) -> LossOutput:
        next_obs = batch[SB.NSTEP_NEXT_OBS]
        q_next_target = batch.get(TARGET_Q_NEXT)
        if q_next_target is None:
            q_next_target = target_net.q_values(next_obs)
        head = online.head()
        if cfg.double_q:
            q_next = q_next_target.gather(-1, online.q_values(next_obs, head).argmax(-1, keepdim=True)).squeeze(-1)
        else:
            q_next = q_next_target.amax(-1)
        target = torch.addcmul(batch[SB.NSTEP_REWARDS], batch[SB.NSTEP_DISCOUNT], q_next)
        step = online.td_gradient(batch[SB.OBS], batch[SB.ACTIONS], target, batch.get(SB.WEIGHTS), delta, head)
        batch[SB.TD_ERROR] = step.td_error
        return LossOutput(step.loss, {"td": step.loss}, {"q_mean": step.q_sa.mean(), "target_mean": target.mean(),
                                                          "epsilon": epsilon(policy)})

    return td_gradient


def c51_hand_gradient(policy: Policy) -> GradientFn | None:
    """``dqn_td`` on the built-in ``q_mlp`` with atoms (C51; noisy heads or not), its gradient derived
    by hand (rlrun/models/c51_grad.py): ``dqn_td_loss``'s distributional branch, with the noise drawn
    in the same order (the online net at s and s' in one pass, then the target net at s'). None (autograd) if the
    target net is not one ``C51Grad`` covers."""
    cfg, target_model = policy.config_as(DQNConfig), policy.state_as(DQNState).target_model
    if not C51Grad.supports(target_model, trains=False):
        return None
    online, target_net = C51Grad(cast(QMLPModel, policy.model)), C51Grad(target_model)
    support = online.support

    def c51_gradient(batch: TorchBatch) -> LossOutput:
        obs, next_obs = batch[SB.OBS], batch[SB.NSTEP_NEXT_OBS]
        rows, head = len(obs), online.head()
        # double Q: the online net at s and at s' in one pass, one noise draw (see dqn_td_loss)
        hs, z = online.logits(torch.cat([obs, next_obs]) if cfg.double_q else obs, head, "train")
        p_next = target_net.probs(next_obs, target_net.head())
        best = (online.expected_q(z[rows:]) if cfg.double_q else torch.matmul(p_next, support)).argmax(-1)
        p_best = p_next.gather(1, best.view(-1, 1, 1).expand(-1, 1, p_next.shape[-1])).squeeze(1)
        target_p = project_distribution(p_best, batch[SB.NSTEP_REWARDS], batch[SB.NSTEP_DISCOUNT], support)
        step = online.ce_gradient(hs, z, batch[SB.ACTIONS], target_p, batch.get(SB.WEIGHTS), head)
        batch[SB.TD_ERROR] = step.per_row
        return LossOutput(step.loss, {"td": step.loss}, {"q_mean": step.q_sa.mean(),
                                                          "target_mean": torch.matmul(target_p, support).mean(),
                                                          "epsilon": epsilon(policy)})

    return c51_gradient


REPLAY_COLUMNS = (SB.OBS, SB.ACTIONS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT)
TARGET_Q_NEXT = "target_q_next"  # the target net's Q-values of NSTEP_NEXT_OBS (dqn_learn's minibatches)
TARGET_CHUNK = 1024  # rows per piece of that forward pass (see replay_minibatches)


def replay_minibatches(state: DQNState, size: int, steps: int) -> Iterator[TorchBatch]:
    """``steps`` minibatches of ``size`` replayed rows, drawn in one go, and the target net's Q-values
    for all of them in one forward pass: the target net does not change during these steps. The
    losses are the ones per-minibatch draws gave (same rows, same values); the learner step is only
    ~3% faster on ``dqn_cartpole``, whose 256x256 net makes each SGD step compute-bound (~3 ms).
    What did pay: the loss's double-Q pass over s' runs outside autograd, so backward covers the
    minibatch's own rows only (one iteration's 64 steps: 183 -> 155 ms, 3 interleaved pairs). The
    target pass goes in pieces of TARGET_CHUNK rows, whose 256-wide activations (1 MB) stay in a core's
    L2 cache: 8,192 rows in one pass cost 265 us per 128 rows here, in pieces of 1,024 166 us; the
    learner's updates/s rose 1.09x (median of 6 interleaved pairs, experiments/dqn_learner). The
    Q-values are the same to the bit (rows are independent)."""
    rows = state.replay.sample(size * steps)
    tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items()}
    if getattr(state.target_model, "num_atoms", 1) == 1:  # a distributional loss needs the atoms instead
        with torch.no_grad():
            nxt = tb[SB.NSTEP_NEXT_OBS]
            q_fn = state.target_grad.q_values if state.target_grad is not None else \
                (lambda x: state.target_model(x).dist_inputs)
            tb[TARGET_Q_NEXT] = torch.cat([q_fn(nxt[i : i + TARGET_CHUNK]) for i in range(0, len(nxt), TARGET_CHUNK)])
    for i in range(steps):
        yield {k: v[i * size : (i + 1) * size] for k, v in tb.items()}


def prioritized_minibatches(policy: Policy, state: DQNState, size: int, steps: int) -> Iterator[TorchBatch]:
    """``steps`` minibatches, each drawn after the previous one's priorities were updated (from the
    ``td_error`` its loss wrote into it), with beta annealed by env steps."""
    cfg = policy.config_as(DQNConfig)
    replay = state.replay
    assert isinstance(replay, PrioritizedReplayBuffer)
    beta = piecewise([[0.0, cfg.prioritized_replay_beta], [float(cfg.prioritized_replay_beta_annealing_timesteps),
                                                           cfg.final_prioritized_replay_beta]], policy.global_timestep)
    for _ in range(steps):
        rows = replay.sample(size, beta)
        idx = rows.pop(SB.BATCH_INDEXES)
        mb: TorchBatch = {k: torch.from_numpy(v) for k, v in rows.items()}
        yield mb
        td = mb.get(SB.TD_ERROR)
        if td is None:
            raise PluginError(f"loss.name: algo.prioritized_replay needs the loss to write each row's TD error "
                              f"into its batch as batch['{SB.TD_ERROR}'] (dqn_td does); loss "
                              f"'{policy.loss_config.name}' did not")
        replay.update_priorities(idx, td.numpy())


def dqn_learn(policy: Policy, batch: SB, ctx: LearnContext) -> dict[str, float]:
    """Store the batch; replay ``training_intensity x len(batch)`` rows in minibatches once
    ``learning_starts`` rows are stored; copy online -> target every ``target_network_update_freq``."""
    cfg = policy.config_as(DQNConfig)
    state = policy.state_as(DQNState)
    state.replay.add(SB({k: batch[k] for k in REPLAY_COLUMNS}))
    stats: dict[str, float] = {}
    if len(state.replay) >= cfg.learning_starts:
        mb = cfg.sgd_minibatch_size or 64
        steps = replay_steps(cfg.training_intensity, cfg.training_intensity_schedule, len(batch), mb,
                             ctx.timesteps_total)
        draw = prioritized_minibatches(policy, state, mb, steps) if isinstance(state.replay, PrioritizedReplayBuffer) \
            else replay_minibatches(state, mb, steps)
        stats = policy.learn_on_minibatches(draw)
    if ctx.timesteps_total - state.last_target_update >= cfg.target_network_update_freq:
        state.target_model.load_state_dict(policy.model.state_dict())
        state.last_target_update = ctx.timesteps_total
        state.num_target_updates += 1
    stats["train/replay_size"] = float(len(state.replay))
    stats["train/num_target_updates"] = float(state.num_target_updates)
    return stats


DQN = register_algorithm(Algorithm(
    "dqn", DQNConfig, default_loss="dqn_td", postprocess=dqn_postprocess, compute_actions=dqn_actions,
    make_state=dqn_state, learn=dqn_learn, needs_next_obs=True, bootstrap_values=False, hand_gradient=dqn_hand_gradient,
    provides_columns=(*COLLECTED_COLUMNS, SB.NEXT_OBS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT),
    metrics=("train/replay_size", "train/num_target_updates"), masks_actions=True,
    description="DQN with double Q, dueling heads, n-step returns",
))
