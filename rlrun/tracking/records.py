"""A run's MLflow record read back: found by id, name or ``runs:/<id>``; its config, provenance files and
metric history; two records' metrics compared per iteration (``rlrun rerun=``, ``rlrun-report <run> <run>``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from rlrun.config.typed import ConfigError
from rlrun.core.history import read_results
from rlrun.core.provenance import PACKAGES_FILE, PATCH_FILE, PLUGINS_DIR, RECORD_DIR

RUN_ID = re.compile(r"[0-9a-f]{32}")
RUN_NAME = re.compile(r"[\w.:\- ]{1,250}")


class Record(NamedTuple):
    run_id: str
    name: str
    experiment: str
    tags: dict[str, str]
    config: dict[str, Any]
    packages: list[str] | None  # None: recorded before rlrun kept them
    patch: bytes  # the uncommitted changes the run was made with (b"": none)
    plugins: dict[str, bytes]  # plugin sources by their path under provenance/plugins/
    rows: list[dict[str, float]] | None  # every iteration's metrics (its last checkpoint's history)


def timing(key: str) -> bool:
    """Metrics that measure the machine, not the learning: left out of the comparison."""
    return key.startswith(("time/", "_timestamp")) or key == "time_total_s" or key.endswith("_per_s")


def parse_spec(spec: str, label: str | None = None) -> tuple[str, str]:
    """``("id", <run id>)`` for an id or ``runs:/<id>``, ``("name", <run name>)``; one line if neither
    (starting with ``label``, by default ``rerun=<spec>``)."""
    label = label or f"rerun={spec}"
    if spec.startswith("runs:/"):
        key = spec[len("runs:/"):].split("/", 1)[0]
        if not RUN_ID.fullmatch(key):
            raise ConfigError(f"{label}: not a run URI of the form runs:/<run id of 32 hex digits>")
        return "id", key
    if RUN_ID.fullmatch(spec):
        return "id", spec
    if not RUN_NAME.fullmatch(spec):
        raise ConfigError(f"{label if label != f'rerun={spec}' else f'rerun={spec!r}'}: not a run id (32 hex "
                          f"digits), runs:/<id>, or a run name")
    return "name", spec


def find_run(client: Any, spec: str, uri: str, label: str | None = None) -> Any:
    """The MLflow run ``spec`` names (an id, ``runs:/<id>``, or a run name) in the store at ``uri``."""
    from mlflow.exceptions import MlflowException

    kind, key = parse_spec(spec, label)
    label = label or f"rerun={spec}"
    if kind == "id":
        try:
            return client.get_run(key)
        except MlflowException:
            raise ConfigError(f"{label}: no run {key} in the tracking store {uri} (a run of another "
                              f"store? add tracking.tracking_uri=<its store>)") from None
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.`mlflow.runName` = '{key}'", max_results=10) if ids else []
    if not runs:
        raise ConfigError(f"{label}: no run named '{key}' in the tracking store {uri}")
    if len(runs) > 1:
        raise ConfigError(f"{label}: {len(runs)} runs are named '{key}' "
                          f"({', '.join(r.info.run_id for r in runs)}): give the run id")
    return runs[0]


def read_record(client: Any, run: Any, label: str, tmp: Path) -> Record:
    """What ``rerun`` (or a comparison) needs of the run's record, downloaded into ``tmp``; one line
    starting with ``label`` for a run that is not rlrun's."""
    run_id = run.info.run_id
    top = {a.path for a in client.list_artifacts(run_id)}
    if "config.yaml" not in top and run.data.tags.get("rlrun.sweep") == "true":
        raise ConfigError(f"{label}: run {run_id} is a sweep's parent run: give one of its jobs' runs "
                          f"(rlrun-report {run_id} lists them)")
    if "config.yaml" not in top:
        raise ConfigError(f"{label}: run {run_id} has no config.yaml artifact (not an rlrun run, or its "
                          f"record is incomplete): nothing to run again")
    config = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", str(tmp))).read_text())
    if not isinstance(config, dict):
        raise ConfigError(f"{label}: run {run_id}'s config.yaml is not a mapping")
    packages, patch, plugins = None, b"", {}
    if RECORD_DIR in top:
        prov = Path(client.download_artifacts(run_id, RECORD_DIR, str(tmp)))
        if (prov / PACKAGES_FILE).is_file():
            packages = (prov / PACKAGES_FILE).read_text().split()
        if (prov / PATCH_FILE).is_file():
            patch = (prov / PATCH_FILE).read_bytes()
        if (prov / PLUGINS_DIR).is_dir():
            plugins = {str(f.relative_to(prov / PLUGINS_DIR)): f.read_bytes()
                       for f in sorted((prov / PLUGINS_DIR).rglob("*")) if f.is_file()}
    rows = None
    checkpoints = sorted(a.path for a in client.list_artifacts(run_id, "checkpoints"))
    if checkpoints:
        last = Path(client.download_artifacts(run_id, checkpoints[-1], str(tmp)))
        if (last / "history.jsonl").is_file():
            rows = read_results(last / "history.jsonl")
    experiment = client.get_experiment(run.info.experiment_id).name
    return Record(run_id, run.info.run_name or run_id, experiment, dict(run.data.tags), config, packages, patch,
                  plugins, rows)


def compare(rec: Record, rows: Sequence[Mapping[str, float]], then: str = "then", now: str = "now") -> tuple[bool, str]:
    """Whether the repeat's per-iteration metrics equal the record's (timings aside), and the summary text
    (``then``/``now``: what the record's and the repeat's values are called)."""
    name = f"run '{rec.name}' ({rec.run_id})"
    if rec.rows is None:
        return False, f"not compared: {name} has no checkpoint with its metric history"
    keys = sorted({k for r in rec.rows for k in r if not timing(k)})
    for i, (a, b) in enumerate(zip(rec.rows, rows, strict=False), 1):
        for k in keys:
            x, y = a.get(k), b.get(k)
            if x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
                return False, f"differs from {name} at iteration {i}: {k} {x!r} {then}, {y!r} {now}"
    if len(rec.rows) != len(rows):
        return False, f"differs from {name}: {len(rec.rows)} iterations {then}, {len(rows)} {now}"
    return True, f"identical to {name}: {len(rows)} iterations x {len(keys)} metrics (timings aside)"


def summary_line(label: str, text: str) -> str:
    """A line in the columns of the run summary (rlrun/tracking/progress.py)."""
    return f"  {label:<11}{text}" if len(label) < 11 else f"  {label} {text}"


def package_drift(a: Sequence[str], b: Sequence[str], sep: str) -> str:
    """``same: N`` or ``K differ: torch 2.12.0 <sep> 2.13.0, ...`` for two ``name==version`` lists."""
    va, vb = (dict(p.split("==", 1) for p in ps if "==" in p) for ps in (a, b))
    drift = [f"{n} {va.get(n, '(none)')} {sep} {vb.get(n, '(none)')}" for n in sorted(va.keys() | vb.keys())
             if va.get(n) != vb.get(n)]
    return f"{len(drift)} differ: {', '.join(drift[:6])}{', ...' if len(drift) > 6 else ''}" if drift \
        else f"same: {len(vb)}"


DIFF_SKIPPED = ("output_dir", "resume", "tracking.", "progress")  # where and how a run was recorded, not what it ran


def diff_lines(a: Record, b: Record) -> list[str]:
    """Two runs side by side: config differences, code and package drift, and where their curves part."""
    from rlrun.core.provenance import flatten

    fa, fb = flatten(a.config), flatten(b.config)
    keys = [k for k in sorted(fa.keys() | fb.keys()) if not k.startswith(DIFF_SKIPPED) and fa.get(k) != fb.get(k)]
    config = "; ".join(f"{k}: {fa.get(k)!r} vs {fb.get(k)!r}" for k in keys[:12]) + ("; ..." if len(keys) > 12 else "")
    sha_a, sha_b = a.tags.get("git_sha", "unknown"), b.tags.get("git_sha", "unknown")
    code = ("not from a git work tree" if sha_a == sha_b == "unknown" else f"same commit {sha_a[:12]}"
            if sha_a == sha_b else f"commit {sha_a[:12]} vs {sha_b[:12]}") + (
        "" if a.patch == b.patch else f"; uncommitted changes differ ({len(a.patch):,} vs {len(b.patch):,} bytes)")
    packages = ("not recorded for both" if a.packages is None or b.packages is None else
                package_drift(a.packages, b.packages, "vs"))
    curves = compare(a, b.rows or [], f"in {a.name}", f"in {b.name}")[1] if b.rows is not None else \
        f"not compared: run {b.run_id} has no checkpoint with its metric history"
    rows = [("runs", f"'{a.name}' ({a.run_id}) vs '{b.name}' ({b.run_id})"),
            ("config", config or "same (output and tracking settings aside)"), ("code", code),
            ("packages", packages),
            ("python", f"{a.tags.get('python', '?')} vs {b.tags.get('python', '?')}"),
            ("machine", f"{a.tags.get('rlrun.cpu', '?')} vs {b.tags.get('rlrun.cpu', '?')}"),
            ("curves", curves)]
    return [summary_line(label, text) for label, text in rows]
