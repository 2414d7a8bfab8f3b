"""``rlrun rerun=<run id | run name | runs:/<id>> [key=value ...]``: run a recorded run again.

The run is found in the tracking store (``tracking.tracking_uri=...`` or the launch dir's ``mlflow.db``);
before anything is computed one block says what will run and what differs from the record (code,
packages, plugin sources, Python, machine). The recorded config (its ``config.yaml`` artifact) then
runs as a new MLflow run in the same experiment, tagged ``rlrun.rerun_of``; extra overrides make a
variant. At the end the repeat's per-iteration metrics are compared with the record's (timings aside):
the summary says ``identical to <run>`` or names the first iteration and metric that differ.
"""

from __future__ import annotations

import math
import platform
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from rlrun.config.typed import ConfigError
from rlrun.core.history import read_results
from rlrun.core.provenance import (
    PACKAGES_FILE,
    PATCH_FILE,
    PLUGINS_DIR,
    RECORD_DIR,
    cpu_model,
    git_state,
    installed_packages,
    plugin_sources,
)

RUN_ID = re.compile(r"[0-9a-f]{32}")
RUN_NAME = re.compile(r"[\w.:\- ]{1,250}")
LABEL = 11  # the summary's label column
SETTINGS = ("progress=", "tracking.")  # overrides that change how a run is shown or recorded, not what it computes


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


def parse_spec(spec: str) -> tuple[str, str]:
    """``("id", <run id>)`` for an id or ``runs:/<id>``, ``("name", <run name>)``; one line if neither."""
    if spec.startswith("runs:/"):
        key = spec[len("runs:/"):].split("/", 1)[0]
        if not RUN_ID.fullmatch(key):
            raise ConfigError(f"rerun={spec}: not a run URI of the form runs:/<run id of 32 hex digits>")
        return "id", key
    if RUN_ID.fullmatch(spec):
        return "id", spec
    if not RUN_NAME.fullmatch(spec):
        raise ConfigError(f"rerun={spec!r}: not a run id (32 hex digits), runs:/<id>, or a run name")
    return "name", spec


def find_run(client: Any, spec: str, uri: str) -> Any:
    """The MLflow run ``spec`` names (an id, ``runs:/<id>``, or a run name) in the store at ``uri``."""
    from mlflow.exceptions import MlflowException

    kind, key = parse_spec(spec)
    if kind == "id":
        try:
            return client.get_run(key)
        except MlflowException:
            raise ConfigError(f"rerun={spec}: no run {key} in the tracking store {uri} (a run of another "
                              f"store? add tracking.tracking_uri=<its store>)") from None
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.`mlflow.runName` = '{key}'", max_results=10) if ids else []
    if not runs:
        raise ConfigError(f"rerun={spec}: no run named '{key}' in the tracking store {uri}")
    if len(runs) > 1:
        raise ConfigError(f"rerun={spec}: {len(runs)} runs are named '{key}' "
                          f"({', '.join(r.info.run_id for r in runs)}): give the run id")
    return runs[0]


def read_record(client: Any, run: Any, spec: str, tmp: Path) -> Record:
    """What ``rerun`` needs of the run's record, downloaded into ``tmp``."""
    run_id = run.info.run_id
    top = {a.path for a in client.list_artifacts(run_id)}
    if "config.yaml" not in top:
        raise ConfigError(f"rerun={spec}: run {run_id} has no config.yaml artifact (not an rlrun run, or its "
                          f"record is incomplete): nothing to run again")
    config = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", str(tmp))).read_text())
    if not isinstance(config, dict):
        raise ConfigError(f"rerun={spec}: run {run_id}'s config.yaml is not a mapping")
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


def differences(rec: Record, launch: Path, plugins: Sequence[str]) -> list[tuple[str, str, bool]]:
    """``(label, what, differs)`` for the code, packages, plugin sources, Python and machine."""
    out = []
    now = git_state(launch)
    was = rec.tags.get("git_sha", "unknown")
    now_patch = now.patch if now.dirty else b""
    if was == "unknown" and now.sha == "unknown":
        out.append(("code", "not from a git work tree, then or now: not compared", False))
    elif was == now.sha and rec.patch == now_patch:
        out.append(("code", f"same: commit {was[:12]}" + (", with the same uncommitted changes" if rec.patch
                                                           else ", no uncommitted changes"), False))
    else:
        parts = [] if was == now.sha else [f"commit {was[:12]} then, {now.sha[:12]} now"]
        if rec.patch != now_patch:
            if rec.patch:
                parts.append(f"the record has uncommitted changes this tree lacks ({len(rec.patch):,} bytes, "
                             f"artifact {RECORD_DIR}/{PATCH_FILE}; `git apply` it to get them back)")
            if now_patch:
                parts.append(f"this tree has uncommitted changes the record lacks ({len(now_patch):,} bytes)")
        out.append(("code", "differs: " + "; ".join(parts), True))
    if rec.packages is None:
        out.append(("packages", "not recorded: not compared", False))
    else:
        then, current = _versions(rec.packages), _versions(installed_packages())
        changed = [f"{n} {then.get(n, '(none)')} -> {current.get(n, '(none)')}"
                   for n in sorted(then.keys() | current.keys()) if then.get(n) != current.get(n)]
        out.append(("packages", f"{len(changed)} differ: " + ", ".join(changed[:6]) + (", ..." if len(changed) > 6
                                                                                    else "")
                    if changed else f"same: {len(current)}", bool(changed)))
    sources = plugin_sources(plugins)
    if not rec.plugins and not sources:
        out.append(("plugins", "none outside the installed packages", False))
    else:
        changed = sorted(k for k in rec.plugins.keys() | sources.keys() if rec.plugins.get(k) != sources.get(k))
        out.append(("plugins", f"differ: {', '.join(changed)}" if changed else f"same: {', '.join(sorted(sources))}",
                    bool(changed)))
    was, is_ = rec.tags.get("python", "?"), platform.python_version()
    out.append(("python", f"same: {is_}" if was == is_ else f"differs: {was} then, {is_} now", was != is_))
    was, is_ = rec.tags.get("rlrun.cpu", "?"), cpu_model()
    out.append(("machine", f"same CPU: {is_}" if was == is_ else f"differs: {was} then, {is_} now", was != is_))
    return out


def _versions(packages: Sequence[str]) -> dict[str, str]:
    return dict(p.split("==", 1) for p in packages if "==" in p)


def apply_overrides(config: dict[str, Any], overrides: Sequence[str], spec: str) -> dict[str, Any]:
    """The recorded config with ``key=value`` overrides (Hydra's grammar) set into it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(f"rerun={spec}: cannot parse the overrides {' '.join(overrides)}: {e}") from None
    out = yaml.safe_load(yaml.safe_dump(config))  # a deep copy
    for o in parsed:
        path = o.key_or_group.split(".")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"rerun={spec}: {o.input_line}: {part} is not a config section")
        if isinstance(node.get(path[-1]), dict):
            raise ConfigError(f"rerun={spec}: {o.input_line}: a config group cannot be chosen again for a recorded "
                              f"run; override its keys instead (e.g. {o.key_or_group}.<key>=<value>)")
        node[path[-1]] = o.value()
    return out


def compare(rec: Record, rows: Sequence[Mapping[str, float]]) -> tuple[bool, str]:
    """Whether the repeat's per-iteration metrics equal the record's (timings aside), and the summary text."""
    name = f"run '{rec.name}' ({rec.run_id})"
    if rec.rows is None:
        return False, f"not compared: {name} has no checkpoint with its metric history"
    keys = sorted({k for r in rec.rows for k in r if not timing(k)})
    for i, (a, b) in enumerate(zip(rec.rows, rows, strict=False), 1):
        for k in keys:
            x, y = a.get(k), b.get(k)
            if x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
                return False, f"differs from {name} at iteration {i}: {k} {x!r} then, {y!r} now"
    if len(rec.rows) != len(rows):
        return False, f"differs from {name}: {len(rec.rows)} iterations then, {len(rows)} now"
    return True, f"identical to {name}: {len(rows)} iterations x {len(keys)} metrics (timings aside)"


def rerun(spec: str, overrides: Sequence[str], launch: Path) -> tuple[Any, bool]:
    """Run the record of ``spec`` again (with ``overrides``); ``(RunResult, identical)``."""
    from mlflow.tracking import MlflowClient

    from rlrun.app.runner import run
    from rlrun.core.quiet import no_download_bars
    from rlrun.sources.plugins import load_plugins
    from rlrun.tracking.tracker import default_tracking_uri

    parse_spec(spec)  # a malformed spec is refused before any store is opened
    uri_given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("tracking.tracking_uri=")]
    uri = uri_given[-1] if uri_given else default_tracking_uri(launch)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise ConfigError(f"rerun={spec}: no MLflow store at {uri[len('sqlite:///'):]} (run it where the run was "
                          f"recorded, or add tracking.tracking_uri=<its store>)")
    client = MlflowClient(tracking_uri=uri)
    with tempfile.TemporaryDirectory(prefix="rlrun-rerun-") as tmp, no_download_bars():
        rec = read_record(client, find_run(client, spec, uri), spec, Path(tmp))
    config = apply_overrides(rec.config, overrides, spec)
    config.update(output_dir=None, resume=None)
    config["tracking"] = {**config.get("tracking", {}), "run_name": None, "tracking_uri": uri,
                          "experiment_name": rec.experiment}
    load_plugins(list(config.get("plugins") or []), search_dirs=[launch])
    found = differences(rec, launch, list(config.get("plugins") or []))
    lines = [f"rlrun: rerun of run '{rec.name}' ({rec.run_id}) in experiment '{rec.experiment}', store {uri}",
             _line("recorded", rec.tags.get("rlrun.command") or rec.tags.get("rlrun.overrides")
                   or "the config in its config.yaml")]
    variant = [o for o in overrides if not o.lstrip("+").startswith(SETTINGS)]
    if variant:
        lines.append(_line("variant", " ".join(variant)))
    if len(variant) < len(overrides):
        lines.append(_line("settings", " ".join(o for o in overrides if o not in variant)))
    lines += [_line(label, what) for label, what, _ in found]
    print("\n".join(lines), flush=True)
    tags = {"rlrun.rerun_of": rec.run_id, "rlrun.rerun_variant": " ".join(variant)[:5000],
            "rlrun.rerun_differs": ", ".join(label for label, _, d in found if d)}
    wait = bool(config["tracking"].get("wait", False))
    result = run(config, launch_dir=launch, background_finish=not wait, extra_tags=tags)
    same, text = compare(rec, result.history)
    print(_line("repeat", text), flush=True)
    return result, same


def _line(label: str, text: str) -> str:
    """A line in the run summary's columns."""
    return f"  {label:<{LABEL}}{text}" if len(label) < LABEL else f"  {label} {text}"
