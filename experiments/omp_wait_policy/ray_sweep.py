"""Wall time of a two-job Ray launcher sweep of ``dqn_cartpole`` (``torch_threads: 2``; each job holds one
CPU, so both run at once on 2 cores) with two versions of rlrun: one that starts two torch threads in each
job, and one that keeps a job's threads within the OMP_NUM_THREADS Ray sets for it (one here).

    git worktree add /tmp/rlrun-before <commit before the change>
    python experiments/omp_wait_policy/ray_sweep.py --before /tmp/rlrun-before --repeats 2 --name <name>

Each sweep is ``rlrun -m hydra/launcher=ray +experiment=dqn_cartpole seed=0,1 stop.timesteps_total=20000
tracking=none``, a fresh process in a fresh temp directory (Ray's files in it too), the two versions
alternating. Writes results/<name>.md and .csv.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ARGS = ["-m", "hydra/launcher=ray", "+experiment=dqn_cartpole", "seed=0,1", "stop.timesteps_total=20000",
        "tracking=none", "progress=false"]


def sweep(src: Path) -> tuple[float, int]:
    """The sweep's wall time and how many of its jobs said they capped their torch threads."""
    with tempfile.TemporaryDirectory(prefix="ows") as d:  # short: Ray's socket paths under it
        env = {**os.environ, "PYTHONPATH": str(src), "RAY_TMPDIR": d, "TMPDIR": d}
        env.pop("OMP_NUM_THREADS", None)
        start = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "rlrun", *ARGS], cwd=d, env=env, capture_output=True, text=True,
                           timeout=1800)
        wall = time.perf_counter() - start
        if p.returncode != 0:
            raise SystemExit(f"the sweep failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
        return wall, (p.stdout + p.stderr).count("torch_threads 2 -> 1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code before the change")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    versions = {"before (two threads a job)": args.before.resolve(), "this checkout": REPO}
    rows = []
    for i in range(args.repeats):
        for label in (list(versions) if i % 2 == 0 else list(reversed(versions))):
            wall, capped = sweep(versions[label])
            rows.append({"repeat": i, "version": label, "wall_s": round(wall, 2), "jobs_capped": capped})
            print(f"repeat {i}, {label}: {wall:.1f} s, {capped} jobs capped their threads", flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = {v: statistics.median(r["wall_s"] for r in rows if r["version"] == v) for v in versions}
    base = med[next(iter(versions))]
    lines = [f"# Two-job Ray launcher sweep of dqn_cartpole (20k env steps a job), {args.name}", "",
             f"`python experiments/omp_wait_policy/ray_sweep.py --before <checkout> --repeats {args.repeats} "
             f"--name {args.name}`", "",
             "| version | sweep wall s per repeat | median | x before | jobs that capped their threads |",
             "| --- | --- | --- | --- | --- |"]
    for v in versions:
        mine = [r for r in rows if r["version"] == v]
        lines.append(f"| {v} | {', '.join(str(r['wall_s']) for r in mine)} | {med[v]:.1f} | {med[v] / base:.2f} | "
                     f"{', '.join(str(r['jobs_capped']) for r in mine)} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
