"""Resuming a run: which checkpoint ``resume=<dir | run output dir | MLflow run id | latest>`` names,
whether this config may continue it, and the text that names it (printed before anything trains)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym

from rlrun.app.run_files import RUN_NAME_META, check_state_fits
from rlrun.config.schemas import RunConfig
from rlrun.models.distributions import model_distribution
from rlrun.tracking.pending import finish_pending
from rlrun.tracking.tracker import TrackingError, default_tracking_uri
from rlrun.training.checkpoint import Checkpoint, check_resumable, load_checkpoint, remove_dead_writes, resolve_resume


def with_resolved_dist(config: Mapping[str, Any], action_spaces: Sequence[gym.Space]) -> dict[str, Any]:
    """``config`` with a null ``model.action_dist`` as the distribution it resolves to for the policies' action
    spaces (where they all resolve it alike): a checkpoint that named it (``twin_q_mlp``'s squashed_gaussian, before
    null meant that) is the same model."""
    model = config.get("model")
    if not isinstance(model, Mapping) or "action_dist" not in model:
        return dict(config)
    named = SimpleNamespace(name=model.get("name"), action_dist=model["action_dist"])
    resolved = {model_distribution(named, space) for space in action_spaces}
    return {**config, "model": {**model, "action_dist": resolved.pop()}} if len(resolved) == 1 else dict(config)


def resume_checkpoint(cfg: RunConfig, launch: Path, out_dir: Path, config_dict: dict[str, Any],
                      job_overrides: Sequence[str] | None, action_spaces: Sequence[gym.Space] = ()
                      ) -> tuple[Checkpoint | None, dict[str, Any], Path | None]:
    """``(checkpoint, harmless config changes, its dir)`` of ``cfg.resume`` (all None / empty without one),
    resolved and checked before anything starts: a refusal changes nothing. ``job_overrides``: a sweep
    job's overrides (its ``latest`` is its own job's checkpoint); ``action_spaces``: the policies'."""
    if not cfg.resume:
        return None, {}, None
    uri = cfg.tracking.tracking_uri or default_tracking_uri(launch)
    path = resolve_resume(cfg.resume, launch, uri, out_dir / "resumed_from", config=config_dict,
                          sweep_job=job_overrides)
    resumed = load_checkpoint(path)
    changes = check_resumable(with_resolved_dist(resumed.config, action_spaces),
                              with_resolved_dist(config_dict, action_spaces), path)
    check_state_fits(resumed, cfg, launch, path)
    remove_dead_writes(path.parent)  # what a kill during the resumed run's last write left
    try:
        if said := finish_pending(path):
            print(f"rlrun: before resuming: {said}", file=sys.stderr, flush=True)
    except TimeoutError as e:
        raise TrackingError(f"resume={cfg.resume}: {e}") from None
    return resumed, changes, path


def resumed_from(path: Path, meta: Mapping[str, Any]) -> str:
    """``<checkpoint>: iteration 12, 24,576 env steps, MLflow run '<name>' (<id>)``."""
    name, run_id = meta.get(RUN_NAME_META), meta.get("mlflow_run_id")
    run = (f"MLflow run '{name}'" if name else "MLflow run") + (f" ({run_id})" if run_id else "")
    steps = meta.get("timesteps_total")
    counted = f", {int(steps):,} env steps" if isinstance(steps, int | float) else ""
    return f"{path}: iteration {meta.get('training_iteration', '?')}{counted}, " + \
        (run if name or run_id else "no MLflow run")
