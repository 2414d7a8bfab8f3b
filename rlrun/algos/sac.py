"""SAC (Haarnoja et al. 2018, with the automatic temperature of the applications paper): twin Q
critics with Polyak-averaged targets, a tanh-squashed Gaussian actor, entropy temperature alpha
learned towards ``target_entropy`` (default -|A|) or fixed (``algo.alpha``). On a Discrete action space
(as RLlib's SAC) the actor is a categorical and every expectation over actions is exact (``sac_discrete``).

Dataflow per iteration, as DQN's: sample ``train_batch_size`` env steps (uniformly random actions
until ``learning_starts``; n-step targets on the worker) -> add them to the replay buffer -> once
``learning_starts`` rows are stored, ``training_intensity x env steps / sgd_minibatch_size`` updates
on uniform minibatches. One update is the loss in two stages (``rlrun.policy.loss.StagedLoss``): the
critic term and a step of the critics' optimizer (``critic_lr``), then the actor and temperature terms on
the stepped critics and a step of their optimizers (``algo.lr``, ``alpha_lr``) - the order of SB3's and
CleanRL's SAC (RLlib's takes every term before any step) - then a Polyak step of the target critics.

The off-policy machinery here (replay, target nets, grouped optimizers, the update loop) is TD3's too
(``rlrun/algos/td3.py``): ``ActorCriticState`` and ``actor_critic_learn``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.algos import sac_discrete
from rlrun.algos.algorithm import COLLECTED_COLUMNS, Algorithm, LearnContext, register_algorithm
from rlrun.config.schemas import AlgoConfig, LossConfig
from rlrun.core.errors import PluginError
from rlrun.core.registry import LOSSES
from rlrun.data.batch import SampleBatch as SB
from rlrun.data.postprocessing import add_nstep
from rlrun.data.replay import ReplayBuffer, replay_checkpoint, replay_steps, restore_replay
from rlrun.models.distributions import ActionDistribution, SquashedGaussian
from rlrun.models.twin_q_compiled import CompiledTwinQGrad, compiler_problem
from rlrun.models.twin_q_grad import TwinQGrad
from rlrun.policy.loss import Stage, StagedLoss
from rlrun.policy.optim import Groups, make_optimizer
from rlrun.policy.policy import ActionOutput, GradientFn, LearnerState, LossOutput, Policy, TorchBatch


@dataclass
class OffPolicyConfig(AlgoConfig):
    """What SAC and TD3 share: replay, targets, update ratio."""

    name: str = "sac"
    lr: float = 3e-4  # the actor's learning rate
    critic_lr: float | None = None  # None: algo.lr
    gamma: float = 0.99
    grad_clip: float | None = None
    adam_eps: float = 1e-8
    train_batch_size: int = 64  # env steps sampled per iteration
    sgd_minibatch_size: int | None = 256  # rows per replay minibatch
    training_intensity: float = 256.0  # replayed rows trained on per env step (256: one update per step)
    training_intensity_schedule: list[list[float]] | None = None  # the same, piecewise linear in env steps
    replay_capacity: int = 1_000_000
    learning_starts: int = 100  # env steps of uniformly random actions, stored before the first update
    tau: float = 0.005  # Polyak step of the target networks
    n_step: int = 1


@dataclass
class SACConfig(OffPolicyConfig):
    name: str = "sac"
    target_network_update_freq: int = 1  # updates between Polyak steps of the target critics
    alpha_lr: float | None = None  # None: algo.lr
    initial_alpha: float = 1.0
    alpha: float | None = None  # a fixed temperature; None: learned towards target_entropy
    target_entropy: float | None = None  # None: -(action dimensions); Discrete: 0.98 log(n)
    hand_gradient: bool = True  # the sac loss's gradient on the built-in twin_q_mlp (Box) derived by hand
    compile_update: bool = False  # that hand-derived update compiled by torch.compile (a C++ compiler; ~35 s once)


REPLAY_COLUMNS = (SB.OBS, SB.ACTIONS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT)


@dataclass
class ActorCriticState:
    """A SAC or TD3 policy's learner state: target networks, replay buffer, temperature, counters."""

    target_model: nn.Module
    replay: ReplayBuffer
    log_alpha: torch.Tensor
    num_updates: int = 0
    # the Polyak step's (targets, sources) lists by name, built once: every update rebuilt them from the
    # modules' parameter iterators (~0.1 ms of a 1:1-cadence round); the tensors are updated in place
    polyak_lists: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = field(default_factory=dict, repr=False)

    def polyak_pair(self, key: str, build: Callable[[], tuple[list[torch.Tensor], list[torch.Tensor]]]
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        pair = self.polyak_lists.get(key)
        if pair is None:
            pair = self.polyak_lists[key] = build()
        return pair

    def get_state(self, include_buffers: bool = False) -> dict[str, Any]:
        return {"target_model": self.target_model.state_dict(), "log_alpha": self.log_alpha.detach(),
                "num_updates": self.num_updates, **replay_checkpoint(self.replay, include_buffers)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self.target_model.load_state_dict(state["target_model"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.num_updates = int(state["num_updates"])
        restore_replay(self.replay, state)


ACTOR_CRITIC_METHODS = ("q", "to_unit", "to_env", "actor_parameters", "critic_parameters")


def actor_critic_problem(model: nn.Module, action_space: gym.Space) -> str | None:
    """What a model lacks to serve SAC/TD3 in ``action_space`` (Algorithm.check_model), else None."""
    missing = [m for m in ACTOR_CRITIC_METHODS if not callable(getattr(model, m, None))]
    if missing:
        return f"a model with actor and Q-critics like twin_q_mlp (methods {', '.join(missing)})"
    if isinstance(action_space, gym.spaces.Discrete) and not callable(getattr(model, "q_all", None)):
        return "a model with a Q-value per action on a Discrete action space like twin_q_mlp's (method q_all)"
    return None


def discrete(policy: Policy) -> bool:
    return isinstance(policy.action_space, gym.spaces.Discrete)


def _check_model(policy: Policy) -> Any:
    problem = actor_critic_problem(policy.model, policy.action_space)
    if problem:
        raise PluginError(f"model.name: algo '{policy.hooks.name}' needs {problem}; model "
                          f"'{policy.spec.model.name}' has not")
    return policy.model


def actor_critic_state(policy: Policy, learned_alpha: bool = True) -> ActorCriticState:
    """Target copy of the model, an empty replay buffer; the policy's optimizer becomes one per
    parameter group (actor, critics, temperature) with its own learning rate."""
    cfg = policy.config_as(OffPolicyConfig)
    model = _check_model(policy)
    initial = getattr(cfg, "initial_alpha", 1.0)
    log_alpha = torch.tensor(math.log(initial), requires_grad=learned_alpha)
    opt = cfg.optimizer

    def group(params: list[torch.Tensor], lr: float | None) -> tuple[Any, float]:
        rate = cfg.lr if lr is None else lr
        return make_optimizer(opt.name, params, rate, cfg.adam_eps, opt.kwargs), rate / cfg.lr

    groups = {"actor": group(model.actor_parameters(), cfg.lr),
              "critic": group(model.critic_parameters(), cfg.critic_lr)}
    if learned_alpha:
        groups["alpha"] = group([log_alpha], getattr(cfg, "alpha_lr", None))
    policy.optimizer = Groups(groups)
    target = copy.deepcopy(policy.model).requires_grad_(False)
    return ActorCriticState(target, ReplayBuffer(cfg.replay_capacity, policy.spec.seed), log_alpha)


def sac_state(policy: Policy) -> LearnerState:
    return actor_critic_state(policy, learned_alpha=policy.config_as(SACConfig).alpha is None)


def off_policy_postprocess(policy: Policy, fragment: SB, last_values: np.ndarray) -> SB:
    cfg = policy.config_as(OffPolicyConfig)
    return add_nstep(fragment, cfg.n_step, cfg.gamma)


def _env_actions(policy: Policy, unit: np.ndarray, dist_inputs: np.ndarray) -> ActionOutput:
    model: Any = policy.model
    actions = model.to_env(unit).reshape((len(unit), *(policy.action_space.shape or ())))
    zeros = np.zeros(len(unit), dtype=np.float32)
    return ActionOutput(actions, zeros, zeros, dist_inputs.astype(np.float32, copy=False))


def random_actions(policy: Policy, n: int) -> ActionOutput:
    """Uniform in the action space's bounds, or over a Discrete space's actions (before ``learning_starts``)."""
    space = policy.action_space
    zeros = np.zeros((n, policy.dist_class.required_inputs(space)), np.float32)
    if isinstance(space, gym.spaces.Discrete):
        return _env_actions(policy, policy.np_rng.integers(int(space.n), size=n), zeros)
    unit = policy.np_rng.uniform(-1.0, 1.0, (n, int(np.prod(space.shape or (1,))))).astype(np.float32)
    return _env_actions(policy, unit, zeros)


def sac_actions(policy: Policy, obs: np.ndarray, explore: bool) -> ActionOutput:
    """tanh(mean + std * noise) scaled to the bounds; greedy: tanh(mean); uniform before learning starts.
    On a Discrete space: a draw from the categorical; greedy: the most probable action."""
    if explore and policy.global_timestep < policy.config_as(SACConfig).learning_starts:
        return random_actions(policy, len(obs))
    with torch.inference_mode():
        di = policy.model(torch.as_tensor(obs)).dist_inputs.numpy()
    if discrete(policy):
        return _env_actions(policy, sac_discrete.sample_actions(di, policy.np_rng, explore), di)
    mean, log_std = np.split(di, 2, axis=-1)
    u = mean
    if explore:
        std = np.exp(np.clip(log_std, SquashedGaussian.LOG_STD_MIN, SquashedGaussian.LOG_STD_MAX))
        u = mean + std * policy.np_rng.standard_normal(mean.shape, dtype=np.float32)
    return _env_actions(policy, np.tanh(u), di)


def target_entropy(policy: Policy) -> float:
    """``algo.target_entropy``; null: -(action dimensions) on a Box, 0.98 log(n) on a Discrete space (RLlib's)."""
    goal = policy.config_as(SACConfig).target_entropy
    if goal is not None:
        return goal
    space = policy.action_space
    if isinstance(space, gym.spaces.Discrete):
        return sac_discrete.default_target_entropy(int(space.n))
    return -float(np.prod(space.shape or (1,)))


def alpha_of(policy: Policy, state: ActorCriticState) -> torch.Tensor:
    fixed = policy.config_as(SACConfig).alpha
    return torch.tensor(fixed) if fixed is not None else state.log_alpha.detach().exp()


@dataclass
class SACLossConfig(LossConfig):
    name: str = "sac"


def sac_critic_loss(policy: Policy, model: nn.Module, dist_class: type[ActionDistribution],
                    batch: TorchBatch) -> LossOutput:
    """The critic stage: 0.5 sum_i (Q_i(s, a) - [R_n + gamma^n (min_i Q'_i(s', a') - alpha log pi(a'|s'))])^2,
    a' ~ pi(s')."""
    st = policy.state_as(ActorCriticState)
    m: Any = model
    alpha = alpha_of(policy, st)
    with torch.no_grad():
        next_obs = batch[SB.NSTEP_NEXT_OBS]
        target_model: Any = st.target_model
        if discrete(policy):  # the expectation over a' of the same
            q_next = sac_discrete.soft_value(model(next_obs).dist_inputs, target_model.q_all(next_obs), alpha)
        else:
            a2, logp2 = SquashedGaussian(model(next_obs).dist_inputs).sample_logp(policy.generator)
            q_next = target_model.q(next_obs, a2).min(0).values - alpha * logp2
        target = batch[SB.NSTEP_REWARDS] + batch[SB.NSTEP_DISCOUNT] * q_next
    q = m.q(batch[SB.OBS], m.to_unit(batch[SB.ACTIONS]))
    critic = 0.5 * (q - target).pow(2).mean(-1).sum()
    return LossOutput(critic, {"critic": critic}, {"q_mean": q.detach().mean(), "target_mean": target.mean()})


def sac_actor_loss(policy: Policy, model: nn.Module, dist_class: type[ActionDistribution],
                   batch: TorchBatch) -> LossOutput:
    """The actor stage, on the critics the critic stage stepped: actor alpha log pi(a~|s) - min_i Q_i(s, a~),
    a~ ~ pi(s) (the critics' weights held fixed); temperature -log alpha (log pi(a~|s) + target_entropy).
    On a Discrete space the expectations over the actions (``sac_discrete``)."""
    cfg = policy.config_as(SACConfig)
    st = policy.state_as(ActorCriticState)
    m: Any = model
    alpha = alpha_of(policy, st)
    obs = batch[SB.OBS]
    if discrete(policy):  # expectations over the actions (sac_discrete.actor_terms); logp: sum_a pi log pi
        actor, logp = sac_discrete.actor_terms(model(obs).dist_inputs, m.q_all(obs, detach=True), alpha)
    else:
        a, logp = SquashedGaussian(model(obs).dist_inputs).sample_logp(policy.generator)
        actor = (alpha * logp - m.q(obs, a, detach=True).min(0).values).mean()
    total = actor
    alpha_loss = torch.zeros(())
    if cfg.alpha is None:
        alpha_loss = -(st.log_alpha * (logp.detach() + target_entropy(policy))).mean()
        total = total + alpha_loss
    return LossOutput(total, {"actor": actor, "alpha": alpha_loss}, {"alpha": alpha, "entropy": -logp.detach().mean()})


# The critics step before the actor's term is computed, as Stable-Baselines3, CleanRL and TD3's authors
# order an update (RLlib's SAC takes every term on the critics before their step). On HalfCheetah-v5, seed 0,
# 200k env steps: 6,766 in this order against 6,212-6,401 in RLlib's (experiments/continuous_control).
sac_loss = StagedLoss(
    Stage(sac_critic_loss, ("critic",)), Stage(sac_actor_loss, ("actor",), optional=("alpha",)),
    doc="SAC's loss in two stages: the critics' (stepped first), then the actor's and the temperature's.",
)
LOSSES.add("sac", sac_loss, config=SACLossConfig, requires=REPLAY_COLUMNS, terms=("critic", "actor", "alpha"),
           stats=("alpha", "q_mean", "target_mean", "entropy"))


def sac_hand_gradient(policy: Policy) -> tuple[GradientFn, GradientFn] | None:
    """The ``sac`` loss on the built-in ``twin_q_mlp``, each stage's gradient derived by hand
    (rlrun/models/twin_q_grad.py): the same losses, draws and statistics as ``sac_loss``'s stages, no
    autograd graph. None (autograd) for another loss or model, or with ``algo.hand_gradient: false``."""
    cfg, st = policy.config_as(SACConfig), policy.state_as(ActorCriticState)
    if not cfg.hand_gradient or policy.loss_fn is not sac_loss or not TwinQGrad.supports(policy.model, st.target_model):
        if cfg.compile_update:
            raise PluginError("algo.compile_update: true compiles the hand-derived update, which needs the sac loss "
                              "on the built-in twin_q_mlp in a Box action space (float32, ReLU or tanh) and "
                              "algo.hand_gradient: true")
        return None
    problem = compiler_problem() if cfg.compile_update else None
    if problem:
        raise PluginError(f"algo.compile_update: {problem}")
    grad = CompiledTwinQGrad(policy.model, st.target_model) if cfg.compile_update else TwinQGrad(
        policy.model, st.target_model)
    return sac_hand_stages(policy, grad)


def sac_hand_stages(policy: Policy, grad: TwinQGrad) -> tuple[GradientFn, GradientFn]:
    """The two stages' gradient functions on ``grad`` (eager ``TwinQGrad`` or ``CompiledTwinQGrad``)."""
    cfg, st = policy.config_as(SACConfig), policy.state_as(ActorCriticState)
    goal = target_entropy(policy)

    def critic_gradient(batch: TorchBatch) -> LossOutput:
        s = grad.critic_gradient(batch, REPLAY_COLUMNS, alpha_of(policy, st), policy.generator)
        return LossOutput(s.critic, {"critic": s.critic}, {"q_mean": s.q_mean, "target_mean": s.target_mean})

    def actor_gradient(batch: TorchBatch) -> LossOutput:
        alpha = alpha_of(policy, st)
        s = grad.actor_gradient(alpha, st.log_alpha if cfg.alpha is None else None, goal)
        return LossOutput(s.actor + s.alpha_loss, {"actor": s.actor, "alpha": s.alpha_loss},
                          {"alpha": alpha, "entropy": s.entropy})

    return critic_gradient, actor_gradient


def polyak(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    with torch.no_grad():
        torch._foreach_lerp_(target, online, tau)


def _critic_targets(state: ActorCriticState, model: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    target: Any = state.target_model
    return list(target.critics.parameters()), [p.detach() for p in model.critic_parameters()]


def sac_after_update(policy: Policy, state: ActorCriticState) -> None:
    """Polyak step of the target critics every ``target_network_update_freq`` updates."""
    cfg = policy.config_as(SACConfig)
    if state.num_updates % cfg.target_network_update_freq == 0:
        polyak(*state.polyak_pair("critics", lambda: _critic_targets(state, policy.model)), cfg.tau)


def replay_updates(policy: Policy, state: ActorCriticState, size: int, steps: int,
                   after: Callable[[Policy, ActorCriticState], None]) -> Iterator[TorchBatch]:
    """``steps`` minibatches of ``size`` rows, drawn in one go; after the policy has taken its step
    on each (the generator resumes then), ``num_updates`` counts it and ``after`` updates targets."""
    rows = state.replay.sample(size * steps)
    tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rows.items()}
    for i in range(steps):
        yield {k: v[i * size : (i + 1) * size] for k, v in tb.items()}
        state.num_updates += 1
        after(policy, state)


def actor_critic_learn(after: Callable[[Policy, ActorCriticState], None]) -> Callable[..., dict[str, float]]:
    def learn(policy: Policy, batch: SB, ctx: LearnContext) -> dict[str, float]:
        """Store the batch; once ``learning_starts`` rows are stored, ``training_intensity x len(batch)``
        replayed rows in minibatches, one update each."""
        cfg = policy.config_as(OffPolicyConfig)
        state = policy.state_as(ActorCriticState)
        state.replay.add(SB({k: batch[k] for k in REPLAY_COLUMNS}))
        stats: dict[str, float] = {}
        if len(state.replay) >= cfg.learning_starts:
            mb = cfg.sgd_minibatch_size or 256
            steps = replay_steps(cfg.training_intensity, cfg.training_intensity_schedule, len(batch), mb,
                                 ctx.timesteps_total)
            stats = policy.learn_on_minibatches(replay_updates(policy, state, mb, steps, after))
        stats["train/replay_size"] = float(len(state.replay))
        stats["train/num_updates"] = float(state.num_updates)
        return stats

    return learn


OFF_POLICY_COLUMNS = (*COLLECTED_COLUMNS, SB.NEXT_OBS, SB.NSTEP_NEXT_OBS, SB.NSTEP_REWARDS, SB.NSTEP_DISCOUNT)

SAC = register_algorithm(Algorithm(
    "sac", SACConfig, default_loss="sac", postprocess=off_policy_postprocess, compute_actions=sac_actions,
    make_state=sac_state, learn=actor_critic_learn(sac_after_update), needs_next_obs=True, bootstrap_values=False,
    hand_gradient=sac_hand_gradient,
    provides_columns=OFF_POLICY_COLUMNS, metrics=("train/replay_size", "train/num_updates"),
    description="Soft actor-critic: twin Q, squashed Gaussian (Box) or categorical (Discrete) actor, learned "
                "temperature",
    action_spaces=(gym.spaces.Box, gym.spaces.Discrete), action_dists=("squashed_gaussian", "categorical"),
    check_model=actor_critic_problem, default_model="twin_q_mlp",
))
