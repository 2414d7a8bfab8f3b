"""What a run's MLflow record says about where it came from: its tags (algo, env, seed, the command line
and the Hydra overrides as typed, git SHA and dirty flag, versions, machine, process) and the provenance
files beside its config (installed packages, the patch of uncommitted changes, plugin sources), which
``rlrun rerun=<run id>`` compares with the present before it runs the recorded config again."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlrun.config.multi_agent import learned_policy_sections
from rlrun.config.schemas import DEFAULT_EXPERIMENT, RunConfig
from rlrun.core.provenance import RECORD_DIR, git_state, process_tags, version_tags, write_record
from rlrun.models.distributions import model_distribution


def default_run_name(cfg: RunConfig) -> str:
    """What the run is: ``<preset or algo-env>-s<seed>-<4 hex>`` (the suffix tells repeats apart)."""
    what = cfg.experiment or f"{cfg.algo.name}-{cfg.env.label}"
    return f"{what}-s{cfg.seed}-{secrets.token_hex(2)}"


def run_tags(cfg: RunConfig, launch: Path, out_dir: Path) -> dict[str, str]:
    """The run's tags; writes ``<out_dir>/provenance/`` (the caller logs it as artifacts)."""
    git = git_state(launch)
    tags = {"rlrun.algo": cfg.algo.name, "rlrun.loss": cfg.loss.name, "rlrun.env": cfg.env.label,
            "rlrun.experiment": cfg.experiment or DEFAULT_EXPERIMENT, "rlrun.seed": str(cfg.seed),
            "mlflow.source.git.commit": git.sha, "git_sha": git.sha, **version_tags(), **process_tags(),
            **write_record(out_dir / RECORD_DIR, git, cfg.plugins)}
    overrides = _hydra_overrides()
    if overrides is not None:
        tags["rlrun.overrides"] = " ".join(overrides)[:5000]
    return tags


def action_dist_tags(cfg: RunConfig, spaces: Mapping[str, tuple[Any, Any]]) -> dict[str, str]:
    """The action distribution each learned policy acts with (``rlrun.action_dist``, or per policy
    ``rlrun.action_dist.<id>``): a null ``model.action_dist``, as the params record it, resolved to the model's
    default for the policy's action space (``spaces``: policy id -> (observation, action) space)."""
    return {"rlrun.action_dist" + (f".{pid}" if prefix else ""): model_distribution(sections.model, spaces[pid][1])
            for pid, prefix, sections in learned_policy_sections(cfg)}


def _hydra_overrides() -> list[str] | None:
    """The overrides of the ``rlrun`` command (or sweep job) running this, as typed; None from Python."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
