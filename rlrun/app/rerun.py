"""``rlrun rerun=<run id | run name | runs:/<id>> [key=value ...]``: run a recorded run again.

The run is found in the tracking store (``tracking.tracking_uri=...`` or the launch dir's ``mlflow.db``);
before anything is computed one block says what will run and what differs from the record (code,
packages, plugin sources, Python, machine). The recorded config (its ``config.yaml`` artifact) then
runs as a new MLflow run in the same experiment, tagged ``rlrun.rerun_of``; extra overrides make a
variant. At the end the repeat's per-iteration metrics are compared with the record's (timings aside):
the summary says ``identical to <run>`` or names the first iteration and metric that differ.
"""

from __future__ import annotations

import platform
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlrun.config.typed import ConfigError
from rlrun.core.provenance import (
    PATCH_CAP,
    PATCH_FILE,
    RECORD_DIR,
    cpu_model,
    git_state,
    installed_packages,
    plugin_sources,
)
from rlrun.tracking.records import (
    Record,
    compare,
    find_run,
    package_drift,
    parse_spec,
    read_record,
    summary_line,
)

# overrides that change how a run is shown or recorded, not what it computes
SETTINGS = ("progress=", "tracking.", "tracking=")


def differences(rec: Record, launch: Path, plugins: Sequence[str]) -> list[tuple[str, str, bool]]:
    """``(label, what, differs)`` for the code, packages, plugin sources, Python and machine."""
    out = []
    now = git_state(launch)
    was = rec.tags.get("git_sha", "unknown")
    now_patch = (now.patch if now.dirty else b"")[:PATCH_CAP]  # as the record keeps it
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
        packages = package_drift(rec.packages, installed_packages(), "->")
        out.append(("packages", packages, not packages.startswith("same")))
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
        rec = read_record(client, find_run(client, spec, uri), f"rerun={spec}", Path(tmp))
    untracked = "tracking=none" in overrides  # repeat it without a new MLflow run (conf/tracking/none.yaml)
    config = apply_overrides(rec.config, [o for o in overrides if o != "tracking=none"], spec)
    config.update(output_dir=None, resume=None)
    config["tracking"] = {**config.get("tracking", {}), "run_name": None, "tracking_uri": uri,
                          "experiment_name": rec.experiment}
    if untracked:
        from importlib.resources import files

        config["tracking"].update(yaml.safe_load(files("rlrun.conf").joinpath("tracking/none.yaml").read_text()))
    load_plugins(list(config.get("plugins") or []), search_dirs=[launch])
    found = differences(rec, launch, list(config.get("plugins") or []))
    lines = [f"rlrun: rerun of run '{rec.name}' ({rec.run_id}) in experiment '{rec.experiment}', store {uri}",
             summary_line("recorded", _recorded(rec.tags))]
    variant = [o for o in overrides if not o.lstrip("+").startswith(SETTINGS)]
    if variant:
        lines.append(summary_line("variant", " ".join(variant)))
    if len(variant) < len(overrides):
        lines.append(summary_line("settings", " ".join(o for o in overrides if o not in variant)))
    lines += [summary_line(label, what) for label, what, _ in found]
    print("\n".join(lines), flush=True)
    tags = {"rlrun.rerun_of": rec.run_id, "rlrun.rerun_variant": " ".join(variant)[:5000],
            "rlrun.rerun_differs": ", ".join(label for label, _, d in found if d)}
    wait = bool(config["tracking"].get("wait", False))
    result = run(config, launch_dir=launch, background_finish=not wait, extra_tags=tags)
    same, text = compare(rec, result.history)
    print(summary_line("repeat", text), flush=True)
    return result, same


def _recorded(tags: Mapping[str, str]) -> str:
    """How the run was made: its command, or a sweep job's overrides and the sweep's command."""
    command, overrides = tags.get("rlrun.command"), tags.get("rlrun.overrides")
    if "mlflow.parentRunId" in tags and overrides:
        return f"{overrides} (job {tags.get('rlrun.job_num', '?')} of the sweep `{command}`)" if command else overrides
    return command or overrides or "the config in its config.yaml"

