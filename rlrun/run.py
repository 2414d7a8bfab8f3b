"""``run(cfg)``: build the trainer, train until a stop criterion, checkpoint, track, return.

Tests and the CLI both call this; it takes a validated ``RunConfig`` or plain config data.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from rlrun.checkpoint import check_resumable, load_checkpoint, resolve_resume, save_checkpoint
from rlrun.config import STOP_COUNTERS, RunConfig, build_config, to_dict
from rlrun.registry import ALGOS, load_plugins
from rlrun.sweep import SweepJob
from rlrun.tracking import (
    ProgressLine,
    TrackingError,
    default_tracking_uri,
    git_sha,
    make_tracker,
    params_from_config,
    version_tags,
)


@dataclass
class RunResult:
    metrics: dict[str, float]  # the last iteration's result
    stop_reason: str
    target_met: bool  # a metric threshold in `stop` was reached (not just a budget)
    checkpoint_dir: Path
    output_dir: Path
    run_id: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)


def stop_reason(stop: Mapping[str, float], result: Mapping[str, float]) -> str | None:
    """The first criterion met (``result[key] >= value``), or None. NaN never meets one."""
    for key, value in stop.items():
        v = result.get(key)
        if v is not None and not math.isnan(v) and v >= value:
            return f"{key} = {v:g} >= {value:g}"
    return None


def target_met(stop: Mapping[str, float], result: Mapping[str, float]) -> bool:
    """A metric threshold of ``stop`` was reached (a counter budget running out does not count)."""
    return any(stop_reason({k: v}, result) for k, v in stop.items() if k not in STOP_COUNTERS)


def run(cfg: RunConfig | Mapping[str, Any], launch_dir: str | Path | None = None,
        sweep: SweepJob | None = None) -> RunResult:
    """Train until ``cfg.stop``; returns the final metrics. ``launch_dir`` anchors relative
    defaults (the MLflow store, plugin imports); it defaults to the current directory. ``sweep``
    makes the MLflow run a child of a sweep's parent run (see rlrun/sweep.py)."""
    launch = Path(launch_dir or os.getcwd()).resolve()
    if not isinstance(cfg, RunConfig):
        plugins = cfg.get("plugins") or []
        load_plugins(list(plugins), search_dirs=[launch])
        cfg = build_config(dict(cfg))
    else:
        load_plugins(cfg.plugins, search_dirs=[launch])
    torch.set_num_threads(cfg.torch_threads)
    out_dir = Path(cfg.output_dir) if cfg.output_dir else Path(tempfile.mkdtemp(prefix="rlrun-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    config_dict = to_dict(cfg)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config_dict, sort_keys=False))

    experiment = cfg.experiment or "default"
    resumed, changes = None, {}
    if cfg.resume:  # resolved and checked before anything starts
        uri = cfg.tracking.tracking_uri or default_tracking_uri(launch)
        resume_path = resolve_resume(cfg.resume, launch, uri, out_dir / "resumed_from")
        resumed = load_checkpoint(resume_path)
        changes = check_resumable(resumed.config, config_dict, resume_path)
    resume_run_id = resumed.meta.get("mlflow_run_id") if resumed else None
    tracker = make_tracker(cfg.tracking, launch, experiment, resume_run_id)
    tags = {
        "rlrun.algo": cfg.algo.name, "rlrun.loss": cfg.loss.name, "rlrun.env": cfg.env.id,
        "rlrun.experiment": experiment, "rlrun.seed": str(cfg.seed),
        "mlflow.source.git.commit": (sha := git_sha(launch)), "git_sha": sha, **version_tags(),
    }
    if resumed:
        tags["rlrun.resumed_from"] = str(resume_path)
        tags["rlrun.resume_changes"] = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())[:5000]
    if sweep is not None:
        tags.update(sweep.tags)
    tracker.start(params_from_config(config_dict), tags)
    if sweep is not None:
        sweep.recorded = True
    tracker.log_artifact(out_dir / "config.yaml")

    progress = ProgressLine(cfg.progress)
    trainer = None
    result: dict[str, float] = {}
    history: list[dict[str, float]] = []
    reason = "not started"
    status = "FAILED"
    ckpt = out_dir / "checkpoints"
    try:
        trainer = ALGOS.get(cfg.algo.name, "algo.name")(cfg, launch)
        if resumed:
            trainer.set_state(resumed.state)
            tracker.wait_started()  # learn which env steps MLflow already holds
        if trainer.workers.ray_address:
            tracker.set_tags({"ray.address": trainer.workers.ray_address})
        while True:
            result = trainer.train()
            history.append(result)
            tracker.check()
            tracker.log_metrics(result, step=int(result["timesteps_total"]))
            progress.update(result)
            every = cfg.checkpoint.every_n_iters
            if every and trainer.iteration % every == 0:
                write_checkpoint(trainer, cfg, result, out_dir, config_dict, tracker)
            met = stop_reason(cfg.stop, result)
            if met:
                reason = met
                break
        status = "FINISHED"
    except KeyboardInterrupt:
        status, reason = "KILLED", "interrupted (Ctrl-C)"
        raise
    except BaseException as e:
        reason = f"failed: {type(e).__name__}: {e}"
        with contextlib.suppress(TrackingError):  # a broken tracker must not hide the real error
            tracker.set_tags({"rlrun.error": f"{type(e).__name__}: {e}"[:5000]})
        raise
    finally:
        progress.close(result or None, reason)
        try:
            if trainer is not None and trainer.iteration > 0:
                ckpt = write_checkpoint(trainer, cfg, result, out_dir, config_dict, tracker)
                if status == "FINISHED" and cfg.tracking.log_model:
                    tracker.log_model(ckpt, launch)
                _describe_run(cfg, history, reason, tracker)
        finally:
            if trainer is not None:
                trainer.stop()
            if sweep is not None and sweep.log_file is not None:
                tracker.log_artifact(sweep.log_file)
            tracker.end(status)
    return RunResult(result, reason, target_met(cfg.stop, result), ckpt, out_dir, tracker.run_id, history)


def _describe_run(cfg: RunConfig, history: list[dict[str, float]], reason: str, tracker: Any) -> None:
    """Learning-curve artifact, a run description and target/stop tags for the MLflow run page."""
    key = "rollout/episode_return_mean"
    points = [(h["timesteps_total"], h[key]) for h in history if key in h]
    returns = [y for _, y in points if not math.isnan(y)]
    met = target_met(cfg.stop, history[-1])
    final = f"{returns[-1]:.1f}" if returns else "n/a"
    best = f"{max(returns):.1f}" if returns else "n/a"
    note = (f"**{cfg.experiment or 'default'}**: algo `{cfg.algo.name}` (loss `{cfg.loss.name}`) on `{cfg.env.id}`, "
            f"seed {cfg.seed}. Final return {final}, best {best} after {int(history[-1]['timesteps_total']):,} env "
            f"steps. Stopped: {reason}. Target met: {'yes' if met else 'no'}.")
    evals = [(h["timesteps_total"], h["eval/episode_return_mean"]) for h in history if "eval/episode_return_mean" in h]
    tracker.log_learning_curve(points, f"{cfg.experiment or cfg.algo.name}: {cfg.env.id}", evals)
    tracker.set_tags({"mlflow.note.content": note, "rlrun.target_met": str(met).lower(), "rlrun.stop_reason": reason})


def write_checkpoint(trainer: Any, cfg: RunConfig, result: Mapping[str, float], out_dir: Path,
                     config_dict: dict[str, Any], tracker: Any) -> Path:
    """Write ``checkpoints/iter_NNNNNN`` atomically, send it to MLflow, keep the newest
    ``checkpoint.keep_last`` locally. Writing the same iteration twice (periodic + final) is a no-op."""
    root = out_dir / "checkpoints"
    path = root / f"iter_{trainer.iteration:06d}"
    if path.exists():
        return path
    tracker.wait_started()  # the checkpoint records the MLflow run id, for resume
    meta = {"algo": cfg.algo.name, "env": cfg.env.id, "created": time.time(), "mlflow_run_id": tracker.run_id,
            **{k: result.get(k) for k in STOP_COUNTERS}, **version_tags()}
    save_checkpoint(path, trainer.get_state(), meta, config_dict)
    tracker.log_artifacts(path, f"checkpoints/{path.name}")
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter_"))
    for old in done[: -cfg.checkpoint.keep_last]:
        if tracker.is_uploaded(old):  # never delete a checkpoint MLflow has not finished copying
            shutil.rmtree(old, ignore_errors=True)
    return path


def make_trainer(overrides: list[str] | None = None, launch_dir: str | Path | None = None) -> Any:
    """A ready Trainer for ``rlrun <overrides>`` without running it (notebooks, debugging)::

        from rlrun import make_trainer
        trainer = make_trainer(["+experiment=ppo_cartpole"])
        print(trainer.workers.local_worker.sample())   # a SampleBatch summary
    """
    from rlrun.cli import compose

    cfg = compose(list(overrides or []), str(launch_dir or os.getcwd()))
    torch.set_num_threads(cfg.torch_threads)
    return ALGOS.get(cfg.algo.name)(cfg, launch_dir)
