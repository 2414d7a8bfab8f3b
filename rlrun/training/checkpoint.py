"""Checkpoints are data, not code: tensors in ``policy.pt`` (loaded with ``weights_only=True``),
metadata in ``meta.json``, the resolved config in ``config.yaml``, the run's metric rows up to it in
``history.jsonl`` (a copy of the run's ``metrics.jsonl``: rlrun/core/history.py). Written atomically: into a
temporary sibling directory, then renamed, so a crash never leaves a half-written checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml

from rlrun.core.errors import CheckpointError, first_line
from rlrun.core.history import HistoryError, MetricHistory, read_rows
from rlrun.core.liveness import process_start

FORMAT_VERSION = 2  # 2: state["policies"][policy_id] (weights, optimizer, RNGs, learner state)
TENSORS_FILE = "policy.pt"
META_FILE = "meta.json"
CONFIG_FILE = "config.yaml"
HISTORY_FILE = "history.jsonl"  # every iteration's metrics up to this checkpoint: resume replays what MLflow lacks
OLD_HISTORY_FILE = "history.json"  # the same as one JSON list (checkpoints written before 2026-11-26)


class Checkpoint(NamedTuple):
    state: dict[str, Any]  # tensors and plain containers (policy weights, optimizer, RNG)
    meta: dict[str, Any]  # JSON: format version, counters, algo, env, versions
    config: dict[str, Any]
    history_file: Path | None = None  # its metric rows (rlrun/core/history.py: read_rows), checked when loaded


def remove_dead_writes(root: Path) -> None:
    """Remove the temp dirs (``.iter_N.tmp-<pid>-*``, ``.iter_N.old-<pid>``) that a checkpoint write left
    when its process was killed; a write of a process that is still alive is left alone."""
    for leftover in root.glob(".iter_*.*-*") if root.is_dir() else []:
        pid = leftover.name.split(".")[-1].split("-")[1]
        if pid.isdigit() and process_start(int(pid)) is None:
            shutil.rmtree(leftover, ignore_errors=True)


def save_checkpoint(
    path: str | Path, state: dict[str, Any], meta: dict[str, Any], config: dict[str, Any],
    history: MetricHistory | None = None,
) -> Path:
    """Write a checkpoint directory atomically; an existing one at ``path`` is replaced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    try:
        torch.save(state, tmp / TENSORS_FILE)
        (tmp / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2))
        (tmp / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
        if history is not None:
            history.copy_to(tmp / HISTORY_FILE)
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
    """Load a checkpoint directory; refuses anything that would need unpickling code, and says in
    one line which file is missing, unreadable or not what it should be."""
    path = Path(path)
    for name in (TENSORS_FILE, META_FILE, CONFIG_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path}: missing {name} (is this an rlrun checkpoint directory?)")
    meta = _read_mapping(path / META_FILE, json.loads, "a JSON object")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path / META_FILE}: format_version {version!r}, this rlrun reads {FORMAT_VERSION}"
        )
    config = _read_mapping(path / CONFIG_FILE, yaml.safe_load, "a YAML mapping")
    return Checkpoint(_load_tensors(path / TENSORS_FILE), meta, config, _checked_history(path))


def load_meta(path: str | Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json`` alone (its iteration, steps, run name and id)."""
    return _read_mapping(Path(path) / META_FILE, json.loads, "a JSON object")


def _read_mapping(path: Path, parse: Any, what: str) -> dict[str, Any]:
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        raise CheckpointError(f"checkpoint {path}: not {what} ({type(e).__name__}: "
                              f"{first_line(e, '')})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path}: expected {what}, got a {type(data).__name__}")
    return data


def _load_tensors(path: Path) -> dict[str, Any]:
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of foreign files
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refuses payloads that need code to rebuild
        raise CheckpointError(
            f"checkpoint {path}: refused to load: it holds objects that need code to rebuild; only tensors and "
            "plain containers are allowed (never load such a file with weights_only=False unless you made it)"
        ) from None
    except Exception as e:  # truncated or corrupt zip archive, wrong file type
        raise CheckpointError(f"checkpoint {path}: cannot be read, truncated or corrupt? ({type(e).__name__}: "
                              f"{first_line(e, '')})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: expected a mapping of state, got a {type(state).__name__}")
    return state


def _checked_history(path: Path) -> Path | None:
    """The checkpoint's history file, read through once to check it (its rows are not kept)."""
    for name in (HISTORY_FILE, OLD_HISTORY_FILE):
        if (path / name).is_file():
            try:
                for _ in read_rows(path / name):
                    pass
            except (HistoryError, OSError, UnicodeDecodeError) as e:
                raise CheckpointError(f"checkpoint {path / name}: not a metric history ({first_line(e)})") from None
            return path / name
    return None


# --------------------------------------------------------------------------- resume
# Config keys that change what a checkpoint's tensors mean: a resume that changes them is refused.
# The seed too: a resumed run continues its checkpoint's random state, and its MLflow run keeps one seed.
INCOMPATIBLE_PREFIXES = ("algo.name", "loss.name", "model.", "env.id", "env.kwargs", "env.observation_space",
                         "env.action_space", "seed")


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (checkpoint value, new value)}`` for every leaf that differs."""
    from rlrun.core.provenance import flatten

    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def check_resumable(old: dict[str, Any], new: dict[str, Any], where: Path) -> dict[str, tuple[Any, Any]]:
    """Refuse changes that make the checkpoint meaningless (other algo, loss, model shape, env);
    return the harmless ones (stop, lr, workers, ...) for the record."""
    changes = config_changes(old, new)
    ignore = ("resume", "output_dir", "experiment", "progress")
    changes = {k: v for k, v in changes.items() if not k.startswith(ignore)}
    bad = {k: v for k, v in changes.items() if k.startswith(INCOMPATIBLE_PREFIXES)}
    if bad:
        lines = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in bad.items())
        hint = f" (a resumed run keeps its checkpoint's seed: add seed={bad['seed'][0]})" if "seed" in bad else ""
        raise CheckpointError(f"resume: checkpoint {where} cannot continue with this config: {lines}{hint}")
    return changes


# what makes two runs "the same experiment" for ``latest``
IDENTITY_KEYS = ("experiment", "algo.name", "env.id")
# a sweep job's overrides of these keys do not make it another job (``latest``: the job's own checkpoint)
NOT_IDENTITY = ("resume", "stop", "progress", "output_dir", "tracking", "checkpoint", "hydra", "experiment")


def job_keys(overrides: Sequence[str]) -> list[str]:
    """The config keys a sweep job's overrides set (``seed=1 algo.lr=1e-3`` -> ``seed``, ``algo.lr``),
    less those that do not tell one job from another (stop, resume, tracking, ...)."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o or o.startswith("~")]
    return [k for k in keys if k.split(".", 1)[0].split("@", 1)[0] not in NOT_IDENTITY]


def _describe(want: dict[str, Any] | None, keys: Sequence[str]) -> str:
    if want is None:
        return "a single run"
    what = f"experiment {want.get('experiment')!r} (algo {want.get('algo.name')}, env {want.get('env.id')}"
    what += "".join(f", {k}={want.get(k)!r}" for k in ("seed", *keys) if k != "seed" or "seed" in want)
    return what + ")"


def find_latest_checkpoint(launch_dir: Path, config: dict[str, Any] | None, sweep_job: Sequence[str] | None = None,
                           key: str = "resume", experiment: str | None = None) -> Path:
    """``latest``: the newest complete ``checkpoints/iter_*`` of a single run (under ``outputs/``) of the
    same experiment - its ``experiment``, ``algo.name``, ``env.id`` and ``seed`` equal ``config``'s - in
    the launch dir. A sweep job (``sweep_job``: its overrides) takes its own job's checkpoint instead:
    under ``multirun/``, with the same values of the keys its overrides set. ``config`` None: any single
    run (of ``experiment``, when given)."""
    from rlrun.core.provenance import flatten

    want = flatten(config) if config is not None else ({"experiment": experiment} if experiment else None)
    keys = job_keys(sweep_job) if sweep_job is not None else []
    root = launch_dir / ("multirun" if sweep_job is not None else "outputs")
    identity: dict[Path, dict[str, Any] | None] = {}  # per run dir: its config (the same in each of its checkpoints)
    matching: list[Path] = []
    other_seeds: set[Any] = set()
    for meta in root.glob("**/checkpoints/iter_*/meta.json"):
        cp = meta.parent
        run_dir = cp.parent.parent
        if run_dir not in identity:
            try:
                identity[run_dir] = flatten(yaml.safe_load((cp / CONFIG_FILE).read_text()) or {})
            except (OSError, yaml.YAMLError, AttributeError):
                identity[run_dir] = None  # not one of ours, or half written: never a candidate
        have = identity[run_dir]
        if have is None:
            continue
        if want is not None:
            if any(have.get(k) != want.get(k) for k in IDENTITY_KEYS if k in want):
                continue
            other_seed = "seed" in want and have.get("seed") != want.get("seed")
            if other_seed or any(have.get(k) != want.get(k) for k in keys):
                other_seeds.add(have.get("seed"))
                continue
        matching.append(cp)
    if not matching:
        where = "sweep jobs" if sweep_job is not None else "single runs"
        seeds = sorted(str(x) for x in other_seeds if x is not None)
        add = f"seed={seeds[0]}" if len(seeds) == 1 else "seed=<n>"
        hint = f"; its runs there have seed {', '.join(seeds)} (add {add})" if sweep_job is None and seeds else ""
        raise CheckpointError(f"{key}=latest: no checkpoint of {_describe(want, keys)} among the {where} under "
                              f"{root}{hint}")
    return max(matching, key=lambda p: ((p / META_FILE).stat().st_mtime, p.name))


def resolve_resume(spec: str, launch_dir: Path, tracking_uri: str | None, download_to: Path,
                   key: str = "resume", config: dict[str, Any] | None = None,
                   sweep_job: Sequence[str] | None = None, experiment: str | None = None) -> Path:
    """``<key>=<checkpoint dir | MLflow run id | latest>`` -> a local checkpoint directory (``latest``:
    see ``find_latest_checkpoint``)."""
    if spec == "latest":
        return find_latest_checkpoint(launch_dir, config, sweep_job, key, experiment)
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = launch_dir / path
    if path.exists():
        if not (path / META_FILE).is_file() and (path / "checkpoints").is_dir():  # a run's output dir
            iters = sorted((path / "checkpoints").glob("iter_*"))
            if iters:
                return iters[-1]
        return path
    if len(spec) == 32 and all(c in "0123456789abcdef" for c in spec) and tracking_uri:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        try:
            names = sorted(a.path for a in client.list_artifacts(spec, "checkpoints"))
        except Exception as e:  # unknown run id, unreachable store
            raise CheckpointError(f"{key}={spec}: cannot read MLflow run {spec} at {tracking_uri}: {e}") from None
        if not names:
            raise CheckpointError(f"{key}={spec}: MLflow run {spec} has no checkpoints/ artifacts")
        download_to.mkdir(parents=True, exist_ok=True)
        from rlrun.core.quiet import no_download_bars

        with no_download_bars():
            return Path(client.download_artifacts(spec, names[-1], str(download_to)))
    raise CheckpointError(f"{key}={spec}: not a checkpoint directory, an MLflow run id, or 'latest'")
