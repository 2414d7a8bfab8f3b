"""What one update per env step costs rlrun's SAC on HalfCheetah-v5: rl-zoo's cadence (SB3's
``train_freq=1, gradient_steps=1``) against 64 env steps then 64 updates (the preset until
2026-11-29), whole process.

Three ways to run the same updates (one 256-row update per env step after 10,000 random steps):

- ``64/64``: an iteration of one 64-step fragment and 64 updates;
- ``1/1 per iteration``: ``algo.train_batch_size=1 rollout.rollout_fragment_length=1``, every env step an
  iteration of its own (a result, its hooks and an MLflow row each);
- ``1/1, 1,024 a report``: the same plus ``min_sample_timesteps_per_iteration=1024``, the rounds of 1 step
  and 1 update repeated inside an iteration that reports once per 1,024 env steps (the preset since
  2026-11-29).

Each configuration runs ``--repeats`` times, interleaved, as the CLI a user types (``rlrun
+experiment=sac_halfcheetah``, its MLflow record complete when it returns). Measured: the whole process's
wall time and the size of the ``mlflow.db`` it leaves. Writes results/<name>.md, .csv and .png.

    python experiments/continuous_control/cadence.py --steps 14336 --repeats 3 --name cadence_2026-11-29
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
ONE = ["algo.train_batch_size=1", "rollout.rollout_fragment_length=1"]
CONFIGS = {  # each spelled out, whatever the preset's own cadence
    "64/64": ["algo.train_batch_size=64", "rollout.rollout_fragment_length=64", "min_sample_timesteps_per_iteration=0"],
    "1/1 per iteration": [*ONE, "min_sample_timesteps_per_iteration=0"],
    "1/1, 1,024 a report (preset)": [*ONE, "min_sample_timesteps_per_iteration=1024"],
}


def run(overrides: list[str], steps: int, threads: int, seed: int) -> tuple[float, int]:
    """Whole-process seconds and the bytes of mlflow.db of one run."""
    with tempfile.TemporaryDirectory(prefix="rlrun-cadence-") as d:
        cmd = [sys.executable, "-m", "rlrun", "+experiment=sac_halfcheetah", f"seed={seed}", f"torch_threads={threads}",
               f"stop.timesteps_total={steps}", "evaluation.interval=0", "checkpoint.every_n_iters=0", "progress=false",
               *overrides,
               f"output_dir={d}/out"]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": d})
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"rlrun failed ({' '.join(overrides)}):\n{p.stderr[-2000:]}")
        return wall, (Path(d) / "mlflow.db").stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14_336)  # 10,000 random steps, then 4,336 updates
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="cadence_latest")
    ap.add_argument("--from-csv", type=Path, help="run nothing: the table and plot again from a CSV this script wrote")
    args = ap.parse_args()
    if args.from_csv:  # the configurations in the order they ran, under today's labels
        with open(args.from_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        label = dict(zip(dict.fromkeys(r["config"] for r in rows), CONFIGS, strict=True))
        write([{**r, "config": label[r["config"]]} for r in rows], args)
        return
    rows: list[dict[str, object]] = []
    for rep in range(args.repeats):
        for label, overrides in CONFIGS.items():
            wall, db = run(overrides, args.steps, args.threads, args.seed)
            rows.append({"config": label, "repeat": rep, "wall_s": round(wall, 2),
                         "mlflow_db_mb": round(db / 2**20, 2)})
            print(rows[-1], flush=True)
    write(rows, args)


def write(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    walls = {c: [float(str(r["wall_s"])) for r in rows if r["config"] == c] for c in CONFIGS}
    dbs = {c: [float(str(r["mlflow_db_mb"])) for r in rows if r["config"] == c] for c in CONFIGS}
    base = statistics.median(walls["64/64"])
    lines = [f"# SAC on HalfCheetah-v5: the cost of one update per env step, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/continuous_control/cadence.py --steps {args.steps} --repeats {args.repeats} "
             f"--threads {args.threads} --seed {args.seed}` ({os.cpu_count()} cores). Whole process, interleaved; "
             "10,000 random steps, then one 256-row update per env step.", "",
             "| cadence | wall time per run (s) | median (s) | / 64/64 | mlflow.db (MB) |",
             "| --- | --- | --- | --- | --- |"]
    for c in CONFIGS:
        m = statistics.median(walls[c])
        lines.append(f"| {c} | {' / '.join(f'{w:.1f}' for w in walls[c])} | {m:.1f} | {m / base:.2f} | "
                     f"{statistics.median(dbs[c]):.1f} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = list(CONFIGS)
    ax.boxplot([walls[c] for c in labels], tick_labels=labels)
    ax.set_ylabel("whole process (s)")
    ax.set_title(f"SAC HalfCheetah-v5, {args.steps:,} env steps")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
