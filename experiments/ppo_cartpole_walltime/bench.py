"""Whole-process wall time of `rlrun +experiment=ppo_cartpole` from command to stop.

Each run starts the real CLI in a fresh launch directory (so it also pays for creating the MLflow
SQLite store), parses the final progress line, and records wall time and env steps to target.
Writes results/<timestamp>.csv, results/latest.md and results/latest.png.

    python experiments/ppo_cartpole_walltime/bench.py --seeds 0 1 2 --repeats 1
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"steps\s+([\d,]+)\s+return\s+([\d.]+).*stopped: (.*)$")


def one_run(seed: int, extra: list[str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rlrun-bench-") as d:
        t0 = time.perf_counter()
        p = subprocess.run(["rlrun", "+experiment=ppo_cartpole", f"seed={seed}", *extra], cwd=d,
                           capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"seed {seed} failed:\n{p.stderr[-2000:]}")
    m = LINE.search(p.stdout.strip().splitlines()[-1])
    assert m, p.stdout[-500:]
    steps, ret, reason = int(m[1].replace(",", "")), float(m[2]), m[3]
    return {"seed": seed, "wall_s": round(wall, 2), "env_steps": steps, "return": ret,
            "target_met": reason.startswith("rollout/episode_return_mean")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("overrides", nargs="*", help="extra rlrun overrides")
    args = ap.parse_args()
    rows = []
    for rep in range(args.repeats):
        for seed in args.seeds:
            r = one_run(seed, args.overrides)
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
    med = statistics.median(r["wall_s"] for r in rows)
    lines = ["| seed | repeat | wall time (s) | env steps | final return | target met |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['seed']} | {r['repeat']} | {r['wall_s']:.1f} | {r['env_steps']:,} | {r['return']:.1f} | "
              f"{r['target_met']} |" for r in rows]
    lines.append(f"\nmedian wall time: **{med:.1f} s** over {len(rows)} runs "
                 f"(overrides: {' '.join(args.overrides) or 'none'}; python {sys.version.split()[0]})")
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter([r["env_steps"] for r in rows], [r["wall_s"] for r in rows])
    for r in rows:
        ax.annotate(f"seed {r['seed']}", (r["env_steps"], r["wall_s"]), fontsize=8)
    ax.axhline(med, ls="--", c="gray", label=f"median {med:.1f} s")
    ax.axhline(15, ls=":", c="red", label="aim: 15 s")
    ax.set_xlabel("env steps to stop")
    ax.set_ylabel("whole-process wall time (s)")
    ax.set_title("rlrun +experiment=ppo_cartpole (CartPole-v1, target 475)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latest.png", dpi=100)


if __name__ == "__main__":
    main()
