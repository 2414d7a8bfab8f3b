"""Algorithm: one registered object that says everything an algorithm is.

    Algorithm(name, config_cls, default_loss, postprocess, compute_actions, make_state, learn, ...)

- ``config_cls``: its config schema (the ``algo:`` section), the only place its defaults live.
- ``default_loss``: the loss used when the config does not pick one.
- ``postprocess(policy, fragment [T, B], last_values [B])``: runs on the workers, adds columns.
- ``compute_actions(policy, obs, explore)``: replaces sampling from the action distribution.
- ``make_state(policy)``: the per-policy learner state (KL coefficient, target network, replay);
  the Policy owns it, checkpoints carry it.
- ``learn(policy, batch, ctx)``: one policy's learning step on one train batch; default
  ``policy.learn_on_batch``. Per policy, so a multi-agent run learns each policy with its own hook.
- ``async_broadcast_interval(config)``: None for synchronous sampling; else the learner takes
  whatever fragments arrived and a worker gets new weights every N-th of its fragments (APPO).
- ``hand_gradient(policy)``: the loss's gradient without autograd where the algorithm has one for
  the policy's loss and model (DQN: ``dqn_td`` on ``q_mlp``; SAC: ``sac`` on ``twin_q_mlp``, one function a
  stage of its ``StagedLoss``), else None: autograd.
- ``provides_columns`` / ``metrics``: checked against the loss's needs and the ``stop`` keys
  before anything runs.

Adding an algorithm = one module with its config, loss, postprocess function and one
``register_algorithm(Algorithm(...))`` call, plus one YAML file in ``conf/algo/``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
from torch import nn

from rlrun.config.schemas import AlgoConfig, LossConfig, ModelConfig
from rlrun.core.errors import PluginError
from rlrun.core.registry import ALGOS, LOSSES, MODELS
from rlrun.data.batch import SampleBatch
from rlrun.data.spaces import MaskedBox
from rlrun.models.check import check_model_fits
from rlrun.models.distributions import model_distribution
from rlrun.policy.policy import (
    DEFAULT_POLICY_ID,
    ActionFn,
    HandGradient,
    LossFn,
    Policy,
    PolicySpec,
    PostprocessFn,
    StateFn,
    no_state,
)

SB = SampleBatch
# columns every worker collects, before any postprocessing
COLLECTED_COLUMNS = (SB.OBS, SB.ACTIONS, SB.REWARDS, SB.TERMINATEDS, SB.TRUNCATEDS, SB.EPS_ID, SB.T, SB.ACTION_LOGP,
                     SB.VF_PREDS, SB.ACTION_DIST_INPUTS)


class LearnContext(NamedTuple):
    """What a learn hook may know of the run besides its policy and batch."""

    timesteps_total: int  # env steps sampled so far, this batch included
    iteration: int  # training iterations completed before this one


LearnFn = Callable[[Policy, SampleBatch, LearnContext], dict[str, float]]


def learn_on_batch(policy: Policy, batch: SampleBatch, ctx: LearnContext) -> dict[str, float]:
    """The default learn hook: SGD on the batch with the policy's loss."""
    return policy.learn_on_batch(batch)


@dataclass(frozen=True)
class Algorithm:
    name: str
    config_cls: type[AlgoConfig]
    default_loss: str
    postprocess: PostprocessFn | None = None
    compute_actions: ActionFn | None = None
    masks_actions: bool = False  # its compute_actions keeps to an action mask (the model's masked outputs)
    make_state: StateFn = no_state
    learn: LearnFn = learn_on_batch
    async_broadcast_interval: Callable[[AlgoConfig], int] | None = None
    needs_next_obs: bool = False  # workers add NEXT_OBS before postprocessing
    # postprocess reads last_values (the value of each env copy's observation after the fragment); off-policy
    # algorithms bootstrap at the learner and skip that forward pass (a 1-step fragment's largest cost)
    bootstrap_values: bool = True
    provides_columns: tuple[str, ...] = COLLECTED_COLUMNS
    metrics: tuple[str, ...] = ()  # metric names this algorithm reports besides the common ones
    recurrent: bool = False  # its data path carries recurrent state (learns with policy.learn_on_batch on sequences)
    description: str = ""
    action_spaces: tuple[type[gym.Space], ...] = ()  # the action spaces it can act in; () = any
    action_dists: tuple[str, ...] = ()  # the action distributions its loss and actions assume; () = any
    # what its model (built for the action space given) lacks, as a problem; else None
    check_model: Callable[[nn.Module, gym.Space], str | None] | None = None
    default_model: str = "mlp"  # the model make_policy builds when given none
    # the loss's gradient without autograd for the (loss, model) pairs it knows, else None (Policy.learn_on_minibatch)
    hand_gradient: Callable[[Policy], HandGradient | None] | None = None


def check_algorithm_fits(algo: Algorithm, model_cfg: ModelConfig, obs_space: gym.Space, action_space: gym.Space,
                         prefix: str = "", observation_filter: str = "none") -> None:
    """Before a run starts: the action space the algorithm acts in, an action mask it can act on, then
    the model (built once and checked against the spaces), then the action distribution - one line
    naming the key."""
    masked = isinstance(obs_space, MaskedBox)
    if masked:
        check_mask_fits(algo, prefix, observation_filter)
    if algo.action_spaces and not isinstance(action_space, algo.action_spaces):
        kinds = " or ".join(t.__name__ for t in algo.action_spaces)
        raise PluginError(f"{prefix}algo.name: algo '{algo.name}' needs a {kinds} action space; the env's is "
                          f"{action_space}")
    try:
        model = check_model_fits(model_cfg, obs_space, action_space)
    except PluginError as e:  # the policy's key prefix in a multi-agent run
        raise PluginError(f"{prefix}{e}") from None
    if masked and getattr(model, "num_atoms", 1) > 1:
        raise PluginError(f"{prefix}model.num_atoms: {model.num_atoms} (C51's atoms) do not take the env's action mask "
                          "yet; set model.num_atoms=1")
    problem = algo.check_model(model, action_space) if algo.check_model is not None else None
    if problem:
        raise PluginError(f"{prefix}model.name: algo '{algo.name}' needs {problem}; model '{model_cfg.name}' has not")
    dist = model_distribution(model_cfg, action_space)
    if algo.action_dists and dist not in algo.action_dists:
        raise PluginError(f"{prefix}model.action_dist: algo '{algo.name}' needs {' or '.join(algo.action_dists)}, "
                          f"got '{dist}'")


def check_mask_fits(algo: Algorithm, prefix: str, observation_filter: str) -> None:
    """An env whose observations carry an action mask (rlrun/envs/action_mask.py): the model masks the
    action distribution (or Q-values), so an algorithm that picks actions its own way would not see it
    unless it says it does (``masks_actions``: DQN's argmax and epsilon-greedy), and a filter would
    rescale the mask."""
    if algo.compute_actions is not None and not algo.masks_actions:
        able = sorted(n for n, a in ((n, ALGOS.get(n)) for n in ALGOS.names())
                      if isinstance(a, Algorithm) and (a.compute_actions is None or a.masks_actions))
        raise PluginError(f"{prefix}algo.name: algo '{algo.name}' does not act on an action mask yet, and the env's "
                          f"observations carry one; these do: {', '.join(able)}")
    if observation_filter != "none":
        raise PluginError(f"rollout.observation_filter: '{observation_filter}' would rescale the env's action mask; "
                          "set rollout.observation_filter=none")


def register_algorithm(algo: Algorithm, override: bool = False) -> Algorithm:
    """Make ``algo`` selectable as ``algo.name: <name>`` (its schema checks the ``algo:`` section)."""
    ALGOS.add(algo.name, algo, config=algo.config_cls, override=override)
    return algo


def get_algorithm(name: str, key: str = "algo.name") -> Algorithm:
    algo = ALGOS.get(name, key)
    if not isinstance(algo, Algorithm):
        raise TypeError(f"{key}: '{name}' is registered as {type(algo).__name__}, not an rlrun.Algorithm")
    return algo


def make_policy(algo: str | Algorithm, obs_space: gym.Space, action_space: gym.Space, *,
                algo_config: AlgoConfig | None = None, loss_config: LossConfig | None = None,
                model_config: ModelConfig | None = None, loss_fn: LossFn | None = None, seed: int = 0,
                policy_id: str = DEFAULT_POLICY_ID) -> Policy:
    """A real Policy outside a run (tests, notebooks): every config the registry's default unless
    given; the loss is ``loss_fn``, else the one ``loss_config`` names, else the algorithm's default.
    The registries must hold the names (``rlrun.sources.plugins.load_builtins()``)."""
    algorithm = algo if isinstance(algo, Algorithm) else get_algorithm(algo)
    algo_config = algo_config or algorithm.config_cls()
    loss_config = loss_config or (LOSSES.entry(algorithm.default_loss).config_cls or LossConfig)()
    if model_config is None:
        model_config = (MODELS.entry(algorithm.default_model).config_cls or ModelConfig)()
        if algorithm.action_dists and model_distribution(model_config, action_space) not in algorithm.action_dists:
            model_config = dataclasses.replace(model_config, action_dist=algorithm.action_dists[0])
    fn = loss_fn or LOSSES.get(loss_config.name, "loss.name")
    spec = PolicySpec(obs_space, action_space, algo_config, loss_config, model_config, seed)
    return Policy(spec, algorithm, fn, policy_id)
