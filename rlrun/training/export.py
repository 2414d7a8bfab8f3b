"""A trained policy outside the trainer: rebuilt from a checkpoint, and logged as an MLflow model.

``load_policy(checkpoint_dir)`` rebuilds the Policy a checkpoint was written by (config, plugins,
spaces from one env copy, weights). ``GreedyActor`` wraps its model as a plain ``nn.Module``
``obs [B, *obs_shape] -> actions [B, ...]`` (the action distribution's deterministic sample,
clipped to a Box's bounds), which ``log_policy_model`` traces to TorchScript for ``mlflow.pytorch``:
``mlflow.pyfunc.load_model("runs:/<id>/model").predict(obs)`` then returns greedy actions. A
recurrent policy's model takes and returns its state too (``RecurrentGreedyActor``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrun.config.multi_agent import snapshots
from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.core.actor_files import ACTOR_FILE, EXAMPLE_FILE, META_FILE
from rlrun.envs.filters import MeanStdFilter, NoFilter
from rlrun.models.distributions import ActionDistribution
from rlrun.policy.policy import DEFAULT_POLICY_ID, Policy
from rlrun.sources.plugins import load_plugins
from rlrun.sources.worker_base import PolicyFactory
from rlrun.training.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from rlrun.training.validate import build_config

MODEL_ARTIFACT = "model"


class LoadedPolicy(NamedTuple):
    policy: Policy
    cfg: RunConfig
    checkpoint: Checkpoint
    obs_space: gym.Space
    action_space: gym.Space


def load_policies(path: str | Path, launch_dir: str | Path | None = None) -> dict[str, LoadedPolicy]:
    """Every policy stored in checkpoint directory ``path`` (one, ``default_policy``, for a single-agent
    run; a multi-agent run's learned policies and heuristics), weights restored, ready to act."""
    launch = str(Path(launch_dir or os.getcwd()).resolve())
    ckpt = load_checkpoint(path)
    load_plugins([str(p) for p in ckpt.config.get("plugins") or []], search_dirs=[launch])
    try:
        cfg = build_config(dict(ckpt.config), for_run=False)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: its config.yaml is not valid for this rlrun: {e}") from None
    policies, spaces = PolicyFactory(cfg, launch).build()
    out = {}
    for pid, policy in policies.items():
        try:
            policy.set_state(ckpt.state["policies"][pid])
        except (KeyError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"checkpoint {path}: the weights of policy '{pid}' do not fit the model in its "
                                  f"config: {e}") from None
        out[pid] = LoadedPolicy(policy, cfg, ckpt, *spaces[pid])
    return out


def load_policy(path: str | Path, launch_dir: str | Path | None = None, policy_id: str | None = None) -> LoadedPolicy:
    """One Policy stored in checkpoint directory ``path`` (default: ``default_policy``, or a
    multi-agent run's first learned policy), weights restored, ready to act."""
    loaded = load_policies(path, launch_dir)
    if policy_id is None:  # the first that learned (not a heuristic, not a snapshot of another)
        policy_id = next((pid for pid, lp in loaded.items() if isinstance(lp.policy, Policy)
                          and pid not in snapshots(lp.cfg)), DEFAULT_POLICY_ID)
    if policy_id not in loaded:
        raise CheckpointError(f"checkpoint {path}: no policy '{policy_id}' (it holds {', '.join(loaded)})")
    return loaded[policy_id]


class GreedyActor(nn.Module):
    """``raw obs -> greedy actions`` as one module (no numpy, no RNG): exportable and servable. A
    policy's observation filter (``rollout.observation_filter: mean_std``) is applied inside, with the
    statistics frozen as the checkpoint saved them, so callers pass raw observations."""

    def __init__(self, model: nn.Module, dist_class: type[ActionDistribution], action_space: gym.Space,
                 obs_filter: NoFilter | None = None) -> None:
        super().__init__()
        self.model = model
        self.dist_class = dist_class
        self.bounds: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(action_space, gym.spaces.Box):
            self.bounds = (torch.as_tensor(action_space.low), torch.as_tensor(action_space.high))
        self.filtered = isinstance(obs_filter, MeanStdFilter)
        if isinstance(obs_filter, MeanStdFilter):
            mean, inv_std = obs_filter.affine()
            self.obs_mean: torch.Tensor
            self.obs_inv_std: torch.Tensor
            self.register_buffer("obs_mean", torch.as_tensor(mean))
            self.register_buffer("obs_inv_std", torch.as_tensor(inv_std))
            self.obs_clip = obs_filter.clip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.filtered:
            obs = torch.clamp((obs.float() - self.obs_mean) * self.obs_inv_std, -self.obs_clip, self.obs_clip)
        actions = self.dist_class(self.model(obs).dist_inputs).deterministic_sample()
        return self._to_bounds(actions)

    def _to_bounds(self, actions: torch.Tensor) -> torch.Tensor:
        """Clip to a Box's bounds; a distribution's [-1, 1] actions (SAC, TD3) are scaled onto them."""
        if self.bounds is None:
            return actions
        low, high = self.bounds
        if self.dist_class.unit_actions:
            actions = low + (actions.reshape(-1, *low.shape) + 1.0) * 0.5 * (high - low)
        return torch.clamp(actions, low, high)


class RecurrentGreedyActor(GreedyActor):
    """A recurrent policy as one module: input ``[B, obs_dim + state_dim]`` = the flattened raw
    observation followed by the state tensors (an LSTM: h and c, then the value LSTM's h and c; zeros
    at an episode start); output ``[B, action_dim + state_dim]`` = the greedy action (a Discrete
    action as one float column) followed by the next state, to feed back with the next observation."""

    def __init__(self, model: nn.Module, dist_class: type[ActionDistribution], action_space: gym.Space,
                 obs_filter: NoFilter | None, obs_shape: tuple[int, ...]) -> None:
        super().__init__(model, dist_class, action_space, obs_filter)
        self.obs_shape = obs_shape
        self.obs_dim = int(np.prod(obs_shape or (1,)))
        rnn: Any = model  # the recurrent interface (rlrun/models/lstm.py)
        self.state_sizes = [int(t.shape[1]) for t in rnn.initial_state(1)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        obs = x[:, :self.obs_dim].reshape(x.shape[0], *self.obs_shape)
        if self.filtered:
            obs = torch.clamp((obs.float() - self.obs_mean) * self.obs_inv_std, -self.obs_clip, self.obs_clip)
        state = list(torch.split(x[:, self.obs_dim:], self.state_sizes, dim=1))
        rnn: Any = self.model
        out, new_state = rnn.forward_step(obs, state)
        actions = self._to_bounds(self.dist_class(out.dist_inputs).deterministic_sample())
        actions = actions.float().reshape(x.shape[0], -1)
        return torch.cat([actions, *new_state], dim=1)


def greedy_actor(loaded: LoadedPolicy) -> GreedyActor:
    p = loaded.policy
    actor = RecurrentGreedyActor(p.model, p.dist_class, loaded.action_space, p.obs_filter,
                                 tuple(loaded.obs_space.shape or ())) if p.recurrent else \
        GreedyActor(p.model, p.dist_class, loaded.action_space, p.obs_filter)
    return actor.eval().requires_grad_(False)


def example_observations(obs_space: gym.Space, n: int = 4, seed: int = 0) -> np.ndarray:
    """``n`` observations sampled from the space: the model's input example (float32, or the space's
    own integer dtype, e.g. uint8 images, which the model scales itself)."""
    obs_space.seed(seed)
    dtype = obs_space.dtype if np.issubdtype(obs_space.dtype, np.integer) and obs_space.shape else np.float32
    return np.stack([np.asarray(obs_space.sample(), dtype=dtype) for _ in range(n)])


def warm_up() -> None:
    """Do ahead of time what makes the first ``log_policy_model`` slow (~2.5 s here): import
    mlflow.pytorch, build MLflow's package map (it checks the model's pip requirements) and resolve
    its run-context tags once (its notebook check imports IPython when installed)."""
    import mlflow.pytorch  # noqa: F401
    from mlflow.models import infer_signature  # noqa: F401

    try:  # private or semi-private helpers; a later MLflow without them only loses the head start
        from mlflow.tracking.context.registry import resolve_tags
        from mlflow.utils.requirements_utils import _init_packages_to_modules_map

        _init_packages_to_modules_map()
        resolve_tags()
    except (ImportError, AttributeError):
        pass


def log_policy_model(tracking_uri: str, run_id: str, checkpoint_dir: str | Path, launch_dir: str | Path) -> str:
    """Log the checkpoint's greedy policy to run ``run_id`` as MLflow model ``model``; a multi-agent
    run's learned policies as ``model_<policy id>``, one each (heuristics have no weights to export;
    snapshots are their sources' earlier weights).
    Returns the URI of the (first) model."""
    loaded = load_policies(checkpoint_dir, launch_dir)
    learned = {pid: lp for pid, lp in loaded.items() if isinstance(lp.policy, Policy) and pid not in snapshots(lp.cfg)}
    uris = [_log_one_model(tracking_uri, run_id, lp, checkpoint_dir,
                           MODEL_ARTIFACT if pid == DEFAULT_POLICY_ID else f"{MODEL_ARTIFACT}_{pid}", pid)
            for pid, lp in learned.items()]
    return uris[0]


def trace_actor(policy: Policy, obs_space: gym.Space, action_space: gym.Space
                ) -> tuple[torch.jit.ScriptModule, np.ndarray, np.ndarray]:
    """The policy's greedy actor traced to TorchScript, its input example and the actions it gives
    for it. Loading the trace needs torch only (not rlrun or your plugins) and runs no pickled Python
    code. (MLflow's default "pt2" export would import torch._dynamo, ~3.5 s here.)"""
    actor = greedy_actor(LoadedPolicy(policy, None, None, obs_space, action_space))  # type: ignore[arg-type]
    example = example_observations(obs_space)
    if isinstance(actor, RecurrentGreedyActor):  # observations then an episode start's (zero) state
        state = np.concatenate(policy.initial_state(len(example)), axis=1)
        example = np.concatenate([example.reshape(len(example), -1), state], axis=1).astype(np.float32)
    with torch.no_grad():
        out = actor(torch.as_tensor(example)).numpy()
        # our own check of the trace: torch's (check_trace) imports torch.testing, ~0.9 s the first time
        scripted = torch.jit.trace(actor, torch.as_tensor(example), check_trace=False)
        if not np.allclose(scripted(torch.as_tensor(example)).numpy(), out):
            raise RuntimeError("the TorchScript trace of the greedy policy does not reproduce its actions")
    return scripted, example, out


def save_actors(policies: Mapping[str, Any], cfg: RunConfig, checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Each learned policy's traced greedy actor, input example and model metadata under ``out_dir``
    (``<model name>/``, in model order), for the MLflow writer to log as MLflow models without importing
    torch (rlrun/tracking/model_files.py): the trainer has the policy at hand and traces it in ~50 ms."""
    out = Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    learned = [(pid, p) for pid, p in policies.items() if isinstance(p, Policy) and pid not in snapshots(cfg)]
    for i, (pid, policy) in enumerate(learned):
        name = MODEL_ARTIFACT if pid == DEFAULT_POLICY_ID else f"{MODEL_ARTIFACT}_{pid}"
        d = out / f"{i:03d}-{name}"
        d.mkdir(parents=True)
        scripted, example, actions = trace_actor(policy, policy.observation_space, policy.action_space)
        torch.jit.save(scripted, str(d / ACTOR_FILE))
        np.savez(d / EXAMPLE_FILE, input=example, output=actions)
        (d / META_FILE).write_text(json.dumps({
            "name": name, "torch_version": torch.__version__,
            "metadata": model_metadata(cfg, checkpoint_dir, pid)}))
    return out



def model_metadata(cfg: RunConfig, checkpoint_dir: str | Path, policy_id: str) -> dict[str, str]:
    return {"rlrun.algo": cfg.algo.name, "rlrun.env": cfg.env.label, "rlrun.checkpoint": Path(checkpoint_dir).name,
            "rlrun.policy_id": policy_id}


def _log_one_model(tracking_uri: str, run_id: str, loaded: LoadedPolicy, checkpoint_dir: str | Path, name: str,
                   policy_id: str) -> str:
    """Log one greedy policy as MLflow model ``name`` with ``mlflow.pytorch`` (a checkpoint whose
    trainer did not save its actors: ``rlrun-wait`` replaying a run); returns its URI."""
    import logging
    import warnings

    import mlflow
    import mlflow.pytorch
    from mlflow.models import Model, infer_signature

    scripted, example, out = trace_actor(loaded.policy, loaded.obs_space, loaded.action_space)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_id=mlflow.MlflowClient().get_run(run_id).info.experiment_id)
    logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)  # its pickle warning; ours is TorchScript
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TorchScript archive.*")
        Model.log(
            artifact_path=None, name=name, flavor=mlflow.pytorch, run_id=run_id,
            pytorch_model=scripted, serialization_format="pickle",  # a ScriptModule: saved with torch.jit.save
            input_example=example, signature=infer_signature(example, out),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
            metadata=model_metadata(loaded.cfg, checkpoint_dir, policy_id),
        )
    return f"runs:/{run_id}/{name}"


def describe(loaded: LoadedPolicy) -> dict[str, Any]:
    m = loaded.checkpoint.meta
    return {"algo": loaded.cfg.algo.name, "env": loaded.cfg.env.label, "timesteps_total": m.get("timesteps_total"),
            "training_iteration": m.get("training_iteration"), "mlflow_run_id": m.get("mlflow_run_id"),
            "rlrun_run_key": m.get("rlrun_run_key")}
