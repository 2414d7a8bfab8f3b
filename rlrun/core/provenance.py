"""What a run records about itself: the flattened config as MLflow params, the git SHA, package versions."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlrun.core.liveness import process_start

MAX_PARAM_VALUE = 6000  # MLflow's param value length limit (characters)
MAX_PARAM_KEY = 250


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 1}}`` -> ``{"algo.lr": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


# how a run was launched, not what it computes: tagged (rlrun.<key>) instead of logged as params
BOOKKEEPING = ("output_dir", "progress", "torch_threads")


def params_from_config(cfg: Mapping[str, Any]) -> dict[str, str]:
    """Flattened config as MLflow params (bookkeeping keys left out), cut to MLflow's length limits."""
    out = {}
    for k, v in flatten({k: v for k, v in cfg.items() if k not in BOOKKEEPING}).items():
        s = "null" if v is None else str(v)
        if len(s) > MAX_PARAM_VALUE:
            s = s[: MAX_PARAM_VALUE - 3] + "..."
        out[_PARAM_KEY_CHARS.sub("_", k)[:MAX_PARAM_KEY]] = s  # e.g. multiagent.policy_mapping.agent_[02]
    return out


_PARAM_KEY_CHARS = re.compile(r"[^\w\-. :/]")  # what MLflow allows in a param name


def git_sha(cwd: str | Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def version_tags() -> dict[str, str]:
    return dict(_version_tags())


@functools.lru_cache(maxsize=1)
def _version_tags() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {"python": sys.version.split()[0]}
    for pkg in ("rlrun", "torch", "gymnasium", "numpy", "mlflow", "hydra-core"):
        try:
            tags[f"version.{pkg}"] = version(pkg)
        except PackageNotFoundError:
            tags[f"version.{pkg}"] = "not installed"
    return tags


def process_tags() -> dict[str, str]:
    """Which process runs this MLflow run: host, pid and the pid's start time (Linux: clock ticks
    since boot), so a later run can tell a live run from one whose process is gone (pid reuse too)."""
    import os
    import socket

    return {"rlrun.host": socket.gethostname(), "rlrun.pid": str(os.getpid()),
            "rlrun.pid_start": process_start(os.getpid()) or ""}
