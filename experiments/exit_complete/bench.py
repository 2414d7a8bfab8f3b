"""Does `rlrun +experiment=ppo_cartpole` return with its MLflow record complete, and what does that cost?

Two parts, each in fresh launch directories (so every run also creates its SQLite store):

* **timing** - whole-process wall time of `tracking=none`, the default (returns once the record is
  complete) and `tracking.wait=false` (detached: returns when training ends), interleaved
  (none, default, detached, none, ...) so all see the same machine load; medians and the default's
  excess over `tracking=none`.
* **trials** - the default run, its output read through a pipe, then - as a container or batch job
  does when its main process exits - every process the run started is SIGKILLed right after `rlrun`
  returns (found by a marker in their environment). Then the record is read from the SQLite store and
  the artifact folder: run FINISHED, learning curve, final checkpoint, MLflow model. The same for
  detached runs with their output in a file (as at a terminal: nothing holds rlrun's end of a pipe)
  shows what the wait buys.

Writes results/<timestamp>.csv, results/latest.md and results/latest.png.

    python experiments/exit_complete/bench.py --repeats 5 --trials 30
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODES = {"none": ["tracking=none"], "default": [], "detached": ["tracking.wait=false"]}


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``marker`` (everything a run started, as a container holds it)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() in (d / "environ").read_bytes():
                found.append(int(d.name))
        except OSError:
            continue
    return found


def one_run(mode: str, seed: int, kill_after: bool, pipe: bool = True) -> dict[str, object]:
    marker = f"RLRUN_EXIT_TRIAL={uuid.uuid4().hex}"
    key, value = marker.split("=")
    env = {**os.environ, "PYTHONPATH": str(REPO), key: value}
    with tempfile.TemporaryDirectory(prefix="rlrun-exit-") as d:
        t0 = time.perf_counter()
        with open(Path(d) / "rlrun.log", "w+") as log:  # pipe=False: output to a file, as at a terminal
            p = subprocess.run([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", f"seed={seed}",
                                *MODES[mode]], cwd=d, stdout=subprocess.PIPE if pipe else log,
                               stderr=subprocess.STDOUT, text=True, timeout=900, env=env)
            wall = time.perf_counter() - t0
            log.seek(0)
            output = p.stdout if pipe else log.read()
        left = _marked_pids(marker)
        if kill_after:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if p.returncode != 0:
            raise SystemExit(f"{mode} seed {seed} failed:\n{output[-2000:]}")
        record = read_record(Path(d)) if mode != "none" else {}
        if not kill_after:  # a detached writer still running: let it finish before its folder goes
            deadline = time.monotonic() + 60
            while _marked_pids(marker) and time.monotonic() < deadline:
                time.sleep(0.1)
    return {"mode": mode, "seed": seed, "wall_s": round(wall, 3), "left_running": len(left),
            "killed_after": kill_after, "pipe": pipe, **record}


def read_record(launch: Path) -> dict[str, object]:
    """The run as the store and the artifact folder hold it right now (no mlflow import: no waiting)."""
    db = launch / "mlflow.db"
    if not db.exists():
        return {"status": "no store", "complete": False}
    con = sqlite3.connect(db)
    try:
        rows = con.execute("select run_uuid, status, artifact_uri from runs").fetchall()
        models = {r[0] for r in con.execute("select source_run_id from logged_models").fetchall()}
    finally:
        con.close()
    if len(rows) != 1:
        return {"status": f"{len(rows)} runs", "complete": False}
    run_id, status, artifact_uri = rows[0]
    art = Path(artifact_uri.removeprefix("file://"))
    curve = (art / "learning_curve.png").exists()
    checkpoint = any((art / "checkpoints").glob("iter_*/*")) if (art / "checkpoints").exists() else False
    model = run_id in models and any(launch.glob("mlartifacts/models/*/artifacts/MLmodel"))
    return {"status": status, "curve": curve, "checkpoint": checkpoint, "model": model,
            "complete": status == "FINISHED" and curve and checkpoint and model}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per mode")
    ap.add_argument("--trials", type=int, default=30, help="default runs killed right after they return")
    ap.add_argument("--detached-trials", type=int, default=5, help="detached runs killed right after they return")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    for _ in range(args.repeats):
        for mode in MODES:
            rows.append(one_run(mode, 0, kill_after=False))
            print(rows[-1], flush=True)
    for i in range(args.trials):
        rows.append(one_run("default", i % 3, kill_after=True))
        print(rows[-1], flush=True)
    for i in range(args.detached_trials):
        rows.append(one_run("detached", i % 3, kill_after=True, pipe=False))
        print(rows[-1], flush=True)
    write(rows)


def write(rows: list[dict[str, object]]) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    keys = sorted({k for r in rows for k in r})
    with open(out / f"{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    timed = {m: [float(r["wall_s"]) for r in rows if r["mode"] == m and not r["killed_after"]] for m in MODES}
    med = {m: statistics.median(v) for m, v in timed.items() if v}
    lines = [f"# exit_complete ({stamp}, `python experiments/exit_complete/bench.py`)", "",
             "## Whole-process wall time, `rlrun +experiment=ppo_cartpole seed=0` (fresh launch dir each run)", "",
             "| mode | runs | median s | runs (s) | record complete when rlrun returned |", "|---|---|---|---|---|"]
    for m, v in timed.items():
        done = [r for r in rows if r["mode"] == m and not r["killed_after"]]
        complete = "n/a" if m == "none" else f"{sum(bool(r.get('complete')) for r in done)}/{len(done)}"
        lines.append(f"| {m} | {len(v)} | {med.get(m, float('nan')):.2f} | {', '.join(f'{x:.2f}' for x in v)} | "
                     f"{complete} |")
    if "none" in med and "default" in med:
        lines += ["", f"Default over `tracking=none`: **{med['default'] - med['none']:+.2f} s** "
                      f"(ratio {med['default'] / med['none']:.2f})."]
    lines += ["", "## Runs killed with everything they started right after `rlrun` returned",
              "", "(default: output through a pipe; detached: output to a file)", "",
              "| mode | trials | record complete | FINISHED | curve | checkpoint | model |",
              "|---|---|---|---|---|---|---|"]
    for m in ("default", "detached"):
        tr = [r for r in rows if r["mode"] == m and r["killed_after"]]
        if tr:
            def count(k: str, tr: list = tr) -> str:
                return f"{sum(bool(r.get(k)) for r in tr)}/{len(tr)}"
            fin = f"{sum(r.get('status') == 'FINISHED' for r in tr)}/{len(tr)}"
            lines.append(f"| {m} | {len(tr)} | {count('complete')} | {fin} | {count('curve')} | {count('checkpoint')} "
                         f"| {count('model')} |")
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot([timed[m] for m in MODES if timed[m]], tick_labels=[m for m in MODES if timed[m]])
    ax.set_ylabel("whole-process wall time (s)")
    ax.set_title("rlrun +experiment=ppo_cartpole: exit with the MLflow record complete")
    fig.tight_layout()
    fig.savefig(out / "latest.png", dpi=120)


if __name__ == "__main__":
    main()
