"""Sweep summary from MLflow: one row per child run, and returns vs env steps per setting.

``write_report(parent_run_id, tracking_uri, out_dir)`` reads the sweep's child runs, writes
``sweep_summary.csv``/``.md`` (overrides, status, final return, env steps, steps and wall time to
the stop target, error) and ``sweep_returns.png`` (mean and min-max band over seeds of the return
vs env steps, one line per hyperparameter setting), logs them to the parent run and prints the
table. ``rlrun-report <sweep dir | parent run id>`` runs it again for a finished sweep.
"""

from __future__ import annotations

import csv
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlrun.core.quiet import short_floats

RETURN = "rollout/episode_return_mean"
FILES = ("sweep_summary.csv", "sweep_summary.md", "sweep_returns.png")


@dataclass
class Row:
    name: str
    run_id: str
    overrides: str
    setting: str  # the overrides without the seed: jobs with the same setting are aggregated
    status: str
    final_return: float
    env_steps: float
    steps_to_target: float  # nan: target not reached (or none set)
    wall_to_target_s: float
    wall_s: float
    error: str


@dataclass
class Summary:
    rows: list[Row]
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]]  # setting -> [(steps, returns)] per job


def setting_of(overrides: str, common: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    """The hyperparameter setting of a job: its overrides minus the seed and those every job shares."""
    parts = [o for o in overrides.split() if o not in common and not re.match(r"^[+~]*seed=", o)]
    return " ".join(parts) or "(all jobs alike)"


def collect(parent_run_id: str, tracking_uri: str) -> Summary:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=10_000)
    children.sort(key=lambda r: int(r.data.tags.get("rlrun.job_num", "0")))
    rows: list[Row] = []
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    token_sets = [set(c.data.tags.get("rlrun.overrides", "").split()) for c in children]
    common = set.intersection(*token_sets) if len(token_sets) > 1 else set()
    for child in children:
        tags, metrics, params = child.data.tags, child.data.metrics, child.data.params
        overrides = tags.get("rlrun.overrides", "")
        threshold = _float(params.get(f"stop.{RETURN}"))
        hist = client.get_metric_history(child.info.run_id, RETURN) if RETURN in metrics else []
        hist.sort(key=lambda m: m.step)
        steps = np.array([m.step for m in hist], dtype=np.float64)
        values = np.array([m.value for m in hist], dtype=np.float64)
        start = child.info.start_time or 0
        hit = next((m for m in hist if not math.isnan(threshold) and m.value >= threshold), None)
        end = child.info.end_time or start
        rows.append(Row(
            name=f"job {tags.get('rlrun.job_num', '?')}", run_id=child.info.run_id, overrides=overrides,
            setting=setting_of(overrides, common), status=child.info.status,
            final_return=float(values[-1]) if len(values) else math.nan,
            env_steps=float(metrics.get("timesteps_total", math.nan)),
            steps_to_target=float(hit.step) if hit else math.nan,
            wall_to_target_s=(hit.timestamp - start) / 1000 if hit else math.nan,
            wall_s=(end - start) / 1000, error=tags.get("rlrun.error", ""),
        ))
        if len(steps):
            curves.setdefault(rows[-1].setting, []).append((steps, values))
    return Summary(rows, curves)


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _fmt(v: float, digits: int = 1) -> str:
    return "-" if isinstance(v, float) and math.isnan(v) else f"{v:,.{digits}f}"


def markdown(summary: Summary) -> str:
    lines = ["| job | overrides | status | final return | env steps | steps to target | wall s to target | wall s "
             "| error |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in summary.rows:
        lines.append(f"| {r.name} | `{short_floats(r.overrides)}` | {r.status} | {_fmt(r.final_return)} | "
                     f"{_fmt(r.env_steps, 0)} | "
                     f"{_fmt(r.steps_to_target, 0)} | {_fmt(r.wall_to_target_s)} | {_fmt(r.wall_s)} | "
                     f"{r.error[:200].replace('|', '/')} |")
    failed = [r for r in summary.rows if r.status != "FINISHED"]
    lines.append(f"\n{len(summary.rows)} jobs, {len(summary.rows) - len(failed)} finished, {len(failed)} failed"
                 + (": " + ", ".join(f"{r.name} (`{r.setting}`)" for r in failed) if failed else ""))
    return "\n".join(lines) + "\n"


def seed_curves(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Each seed's return on one grid of env steps up to the longest seed, ``[n_seeds, n_points]``.
    A seed that stopped early (it met the target) holds its final value: the mean then shows what
    the setting reached, not what the slowest-stopping seed's neighbours had at that point."""
    hi_x = max(float(s[-1]) for s, _ in runs)
    lo_x = min(float(s[0]) for s, _ in runs)
    grid = np.linspace(lo_x, hi_x, 100) if hi_x > lo_x else np.array([lo_x])
    ys = np.stack([np.interp(grid, s, np.nan_to_num(v, nan=np.nanmin(v) if np.isfinite(v).any() else 0.0))
                   for s, v in runs])  # np.interp holds the first and last values outside a seed's range
    return grid, ys


def plot(summary: Summary, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for setting, runs in sorted(summary.curves.items()):
        grid, ys = seed_curves(runs)
        line = ax.plot(grid, ys.mean(axis=0), label=f"{setting} (n={len(runs)})")[0]
        if len(runs) > 1:
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("training episode return (rollout/episode_return_mean)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if summary.curves:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(parent_run_id: str, tracking_uri: str, out_dir: str | Path, log: bool = True) -> Summary:
    """Collect, write the table and plot into ``out_dir``, log them to the parent run, print the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = collect(parent_run_id, tracking_uri)
    fields = list(Row.__dataclass_fields__)
    with open(out / "sweep_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(asdict(r) for r in summary.rows)
    md = markdown(summary)
    (out / "sweep_summary.md").write_text(md)
    plot(summary, out / "sweep_returns.png",
         f"sweep {parent_run_id[:8]}: mean and range over seeds (a stopped seed holds its last value)")
    if log:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        for name in FILES:
            client.log_artifact(parent_run_id, str(out / name))
    print(f"\nrlrun: sweep summary (MLflow parent run {parent_run_id}; files in {out})\n{md}", flush=True)
    return summary


REPORT_HELP = """\
usage: rlrun-report <sweep dir | MLflow parent run id> [tracking_uri=<uri>]

Rebuild a finished sweep's summary from MLflow: sweep_summary.csv and .md (per job: overrides,
status, final return, env steps, steps and wall time to the stop target, error) and
sweep_returns.png (return vs env steps, mean and min-max band over seeds per setting), logged to
the sweep's parent run and printed as a table.

example:
  rlrun-report multirun/2026-11-22/15-20-01

rlrun-report <run> <run> [tracking_uri=...] shows two runs side by side (ids, names or runs:/<id>):
config differences, code and package drift, and where their curves part."""


def diff_main(a: str, b: str, uri: str) -> None:
    """``rlrun-report <run> <run>``: two runs side by side (rlrun/tracking/records.py ``diff_lines``)."""
    import tempfile

    from mlflow.tracking import MlflowClient

    from rlrun.config.typed import ConfigError
    from rlrun.core.quiet import no_download_bars
    from rlrun.tracking.records import diff_lines, find_run, read_record

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        print(f"rlrun-report: error: no MLflow store at {uri[len('sqlite:///'):]} (add tracking_uri=<its store>)",
              file=sys.stderr)
        sys.exit(2)
    client = MlflowClient(tracking_uri=uri)
    try:
        with tempfile.TemporaryDirectory(prefix="rlrun-report-") as tmp, no_download_bars():
            records = [read_record(client, find_run(client, spec, uri, spec), spec, Path(tmp) / str(i))
                       for i, spec in enumerate((a, b))]
    except ConfigError as e:
        print(f"rlrun-report: error: {e}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(diff_lines(*records)))


def main(argv: list[str] | None = None) -> None:
    """``rlrun-report <sweep dir | parent run id> [tracking_uri=...]``, or ``rlrun-report <run> <run>``"""
    from rlrun.core.sweep_info import read_sweep_info
    from rlrun.tracking.tracker import default_tracking_uri

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(REPORT_HELP)
        sys.exit(0 if argv else 2)
    runs = [a for a in argv if "=" not in a]
    if len(runs) == 2:
        opts = dict(a.split("=", 1) for a in argv if "=" in a)
        uri = opts.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(Path.cwd())
        diff_main(runs[0], runs[1], uri)
        return
    target = argv[0]
    opts = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    unknown = [a for a in argv[1:] if not a.startswith("tracking_uri=")]
    if unknown:
        print(f"rlrun-report: error: unknown argument {unknown[0]!r} (only tracking_uri=<uri>)", file=sys.stderr)
        sys.exit(2)
    info = read_sweep_info(target) if Path(target).is_dir() else None
    if info is not None:
        run_id, uri, out = info.parent_run_id, opts.get("tracking_uri", info.tracking_uri), Path(target)
    elif re.fullmatch(r"[0-9a-f]{32}", target):
        run_id = target
        uri = opts.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(Path.cwd())
        out = Path.cwd() / "rlrun-report" / run_id
    else:
        print(f"rlrun-report: error: {target}: not a sweep directory (no rlrun_sweep.json) and not an MLflow run id",
              file=sys.stderr)
        sys.exit(2)
    try:
        write_report(run_id, uri, out)
    except Exception as e:  # unknown run id, unreachable store
        print(f"rlrun-report: error: cannot read sweep {run_id} at {uri}: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
