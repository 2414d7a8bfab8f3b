"""A run's files on disk: its output directory and its checkpoints - written atomically, sent to
MLflow, pruned locally - and the checks a resume or an existing ``output_dir`` must pass first."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.core.errors import CheckpointError, first_line
from rlrun.core.history import MetricHistory
from rlrun.core.metrics import STOP_COUNTERS
from rlrun.core.provenance import version_tags
from rlrun.tracking.tracker import Tracker, TrackingError
from rlrun.training.checkpoint import Checkpoint, remove_dead_writes, save_checkpoint
from rlrun.training.trainer import Trainer


def default_output_dir(launch: Path) -> Path:
    """Where a run from Python without ``output_dir`` writes: ``<launch dir>/outputs/<date>/<time>-<pid>``,
    the CLI's layout (so ``resume=latest`` finds it), never an uncleaned temp dir; unique per call."""
    stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
    for i in range(1000):
        path = launch / "outputs" / f"{stamp}-{os.getpid()}{f'-{i}' if i else ''}"
        if not path.exists():
            return path
    raise ConfigError(f"output_dir: no free directory name under {launch / 'outputs'}")


def check_state_fits(ckpt: Checkpoint, cfg: RunConfig, launch: Path, where: Path) -> None:
    """Load the checkpoint's state into policies built from ``cfg`` (no workers, no Ray) and check its
    counters, so that a checkpoint that cannot be resumed is refused before anything starts."""
    from rlrun.sources.worker_base import make_policy_factory

    state = ckpt.state
    try:
        counters = state["counters"]
        for key in STOP_COUNTERS:
            float(counters[key])
        policies = make_policy_factory(cfg, launch).build()[0]
        for pid, policy in policies.items():
            policy.set_state(state["policies"][pid])
        _ = (state["episodes"]["returns"], state["rng"]["torch"])  # present
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        text = first_line(e, "")
        raise CheckpointError(f"resume: checkpoint {where} does not fit this config ({type(e).__name__}: "
                              f"{text[:300]}); nothing was changed") from None


RUN_KEY_META = "rlrun_run_key"  # a checkpoint's run (the MLflow run's rlrun.run_key tag)
RUN_NAME_META = "run_name"  # its MLflow run name: a resumed run keeps it (the summary names the same run)


def check_output_dir_is_ours(out_dir: Path, run_key: str, resume_run_id: str | None) -> None:
    """Refuse an output dir that holds another run's checkpoints (two runs' checkpoints must never
    mix); a resumed run may continue in its own. A checkpoint names its run by run key, or (written
    before run keys) by MLflow run id."""
    for meta in sorted((out_dir / "checkpoints").glob("iter_*/meta.json")):
        try:
            info = json.loads(meta.read_text())
            key, owner = info.get(RUN_KEY_META), info.get("mlflow_run_id")
        except (OSError, ValueError, AttributeError):
            key = owner = None
        if key != run_key and (owner is None or owner != resume_run_id):
            raise CheckpointError(
                f"output_dir: {out_dir} already holds checkpoints of another run ({meta.parent.name}, MLflow run "
                f"{owner or key}); give this run its own output_dir, or resume that run with resume={meta.parent}"
            )


def write_checkpoint(trainer: Trainer, cfg: RunConfig, result: Mapping[str, float], out_dir: Path,
                     config_dict: dict[str, Any], tracker: Any, history: MetricHistory | None = None,
                     run_key: str = "", run_name: str | None = None) -> Path:
    """Write ``checkpoints/iter_NNNNNN`` atomically, send it to MLflow, keep the newest
    ``checkpoint.keep_last`` locally. Writing the same iteration twice (periodic + final) is a no-op.
    The checkpoint names its run by ``run_key`` and, once the writer has created it, by MLflow run id;
    it does not wait for the id (a short run would wait seconds for mlflow's import and the store)."""
    root = out_dir / "checkpoints"
    path = root / f"iter_{trainer.iteration:06d}"
    if path.exists():
        return path
    remove_dead_writes(root)
    try:
        tracker.check()  # learns the MLflow run id if the writer has sent it
        tracking_ok = True
    except TrackingError:  # the checkpoint is kept locally all the same; the error is reported by the run
        tracking_ok = False
    meta = {"algo": cfg.algo.name, "env": cfg.env.label, "created": time.time(), "mlflow_run_id": tracker.run_id,
            RUN_KEY_META: run_key, RUN_NAME_META: run_name,
            **{k: result.get(k) for k in STOP_COUNTERS}, **version_tags()}
    save_checkpoint(path, trainer.get_state(), meta, config_dict, history)
    if tracking_ok:
        tracker.log_artifacts(path, f"checkpoints/{path.name}")
        _prune_checkpoints(root, cfg.checkpoint.keep_last, tracker)
    return path


def _prune_checkpoints(root: Path, keep_last: int, tracker: Tracker) -> None:
    """Keep the newest ``keep_last`` local checkpoints; an older one goes only once MLflow has it.
    While uploads lag, at most ``2 x keep_last`` stay: past that the trainer waits for the oldest
    upload (the writer uploads in order). Measured before the bound: 10 local dirs with keep_last=3
    and a checkpoint every iteration on a loaded 2-core machine, 15-29 in the issue's report."""
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter_"))
    local = len(done)
    for old in done[:-keep_last]:
        if tracker.is_uploaded(old) or (local > 2 * keep_last and tracker.wait_uploaded(old)):
            shutil.rmtree(old, ignore_errors=True)
            local -= 1
