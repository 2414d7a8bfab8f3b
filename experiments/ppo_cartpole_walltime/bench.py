"""Whole-process wall time of `rlrun +experiment=ppo_cartpole` from command to stop.

Each run starts the real CLI in a fresh launch directory (so it also pays for creating the MLflow
SQLite store), parses the final progress line, and records wall time and env steps to target.
Writes results/<timestamp>.csv, results/latest.md and results/latest.png.

    python experiments/ppo_cartpole_walltime/bench.py --seeds 0 1 2 --repeats 1
    python experiments/ppo_cartpole_walltime/bench.py --before /path/to/older/checkout   # before/after
    python experiments/ppo_cartpole_walltime/bench.py --preset pg_cartpole --before ...  # another preset

``--before DIR`` also runs the rlrun found in DIR (a checkout with ``rlrun/conf`` linked to its
``conf``), interleaved with this one (before, after, before, after, ...), so both see the same
machine load; the table then gives each version's median and their ratio.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"steps\s+([\d,]+)\s+return\s+([\d.]+).*stopped: (.*)$")
SUMMARY = re.compile(r"^rlrun: stopped: (.*?)(?: \(target met\))?\n"
                     r"\s+return\s+final ([\d.-]+).*\n\s+env steps\s+([\d,]+)", re.M)


REPO = HERE.parents[1]


def one_run(seed: int, extra: list[str], code_dir: Path = REPO, preset: str = "ppo_cartpole") -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    with tempfile.TemporaryDirectory(prefix="rlrun-bench-") as d:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "rlrun", f"+experiment={preset}", f"seed={seed}", *extra],
                           cwd=d, capture_output=True, text=True, timeout=900, env=env)
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"seed {seed} failed:\n{p.stderr[-2000:]}")
    summary = SUMMARY.search(p.stdout)
    if summary:  # the end-of-run summary (rlrun/tracking/progress.py)
        reason, ret, steps = summary[1], float(summary[2]), int(summary[3].replace(",", ""))
    else:  # an older checkout (--before): its last progress line
        m = LINE.search(p.stdout.strip().splitlines()[-1])
        assert m, p.stdout[-500:]
        steps, ret, reason = int(m[1].replace(",", "")), float(m[2]), m[3]
    return {"seed": seed, "wall_s": round(wall, 2), "env_steps": steps, "return": ret,
            "target_met": reason.startswith("rollout/episode_return_mean")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--before", type=Path, help="an older checkout to run interleaved with this one")
    ap.add_argument("--preset", default="ppo_cartpole", help="the +experiment preset to run")
    ap.add_argument("overrides", nargs="*", help="extra rlrun overrides")
    args = ap.parse_args()
    versions = [("before", args.before), ("after", REPO)] if args.before else [("this", REPO)]
    rows = []
    for rep in range(args.repeats):
        for seed in args.seeds:
            for name, code_dir in versions:
                r = {"version": name, **one_run(seed, args.overrides, code_dir, args.preset)}
                r["repeat"] = rep
                rows.append(r)
                print(r, flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(out / f"{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = statistics.median(r["wall_s"] for r in rows if r["version"] == versions[-1][0])
    lines = ["| version | seed | repeat | wall time (s) | env steps | final return | target met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['version']} | {r['seed']} | {r['repeat']} | {r['wall_s']:.1f} | {r['env_steps']:,} | "
              f"{r['return']:.1f} | {r['target_met']} |" for r in rows]
    for name, _ in versions:
        m = statistics.median(r["wall_s"] for r in rows if r["version"] == name)
        n = sum(r["version"] == name for r in rows)
        lines.append(f"\nmedian wall time ({name}): **{m:.1f} s** over {n} runs")
    if args.before:
        b = statistics.median(r["wall_s"] for r in rows if r["version"] == "before")
        lines.append(f"\nafter / before: **{med / b:.2f}**")
    lines.append(f"\n(overrides: {' '.join(args.overrides) or 'none'}; python {sys.version.split()[0]})")
    tag = "" if args.preset == "ppo_cartpole" else f"_{args.preset}"
    lines.append(f"(preset: {args.preset})")
    (out / f"latest{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, _ in versions:
        sel = [r for r in rows if r["version"] == name]
        ax.scatter([r["env_steps"] for r in sel], [r["wall_s"] for r in sel], label=name)
    for r in rows:
        ax.annotate(f"seed {r['seed']}", (r["env_steps"], r["wall_s"]), fontsize=8)
    ax.axhline(med, ls="--", c="gray", label=f"median {med:.1f} s")
    ax.axhline(15, ls=":", c="red", label="aim: 15 s")
    ax.set_xlabel("env steps to stop")
    ax.set_ylabel("whole-process wall time (s)")
    ax.set_title(f"rlrun +experiment={args.preset}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"latest{tag}.png", dpi=100)


if __name__ == "__main__":
    main()
