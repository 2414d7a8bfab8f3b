"""Checkpoints are data, not code: tensors in ``policy.pt`` (loaded with ``weights_only=True``),
metadata in ``meta.json``, the resolved config in ``config.yaml``. Written atomically: into a
temporary sibling directory, then renamed, so a crash never leaves a half-written checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml

FORMAT_VERSION = 1
TENSORS_FILE = "policy.pt"
META_FILE = "meta.json"
CONFIG_FILE = "config.yaml"


class CheckpointError(ValueError):
    pass


class Checkpoint(NamedTuple):
    state: dict[str, Any]  # tensors and plain containers (policy weights, optimizer, RNG)
    meta: dict[str, Any]  # JSON: format version, counters, algo, env, versions
    config: dict[str, Any]


def save_checkpoint(
    path: str | Path, state: dict[str, Any], meta: dict[str, Any], config: dict[str, Any]
) -> Path:
    """Write a checkpoint directory atomically; an existing one at ``path`` is replaced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        torch.save(state, tmp / TENSORS_FILE)
        (tmp / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2))
        (tmp / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load a checkpoint directory; refuses anything that would need unpickling code."""
    path = Path(path)
    for name in (TENSORS_FILE, META_FILE, CONFIG_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path}: missing {name} (is this an rlrun checkpoint directory?)")
    try:
        meta = json.loads((path / META_FILE).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path / META_FILE}: not valid JSON ({e})") from None
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path / META_FILE}: format_version {version!r}, this rlrun reads {FORMAT_VERSION}"
        )
    try:
        state = torch.load(path / TENSORS_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for payloads that need code
        raise CheckpointError(
            f"checkpoint {path / TENSORS_FILE}: refused to load ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); only tensors and plain containers are allowed"
        ) from None
    config = yaml.safe_load((path / CONFIG_FILE).read_text()) or {}
    return Checkpoint(state, meta, config)
