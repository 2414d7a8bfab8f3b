"""Issue 34's wall-time lines, by the protocol the README's tables use: ``dqn_cartpole`` of issue 34's day
(commit d30185c, from a tree exported with ``git archive``) against today's ``dqn_cartpole`` and
``rainbow_cartpole``, whole process to a 100-episode mean of 475 (each preset's stop and env-step
budget), seeds 0-2, the three alternating seed by seed, each ``python -m rlrun +experiment=E seed=S
progress=false`` in a fresh directory with its complete MLflow record (``tracking`` as the preset has it).

    git -C . archive d30185c | tar -x -C /path/to/d30185c
    python experiments/dqn_cartpole_tuning/walltime.py --before /path/to/d30185c --seeds 0 1 2 --name walltime_<date>

Writes results/<name>.md, .csv and .png: per run the wall time, the env steps at the stop and whether
475 was reached; per setting the medians and their ratio to the code of issue 34's day.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TARGET = 475.0  # the presets' stop: a 100-episode mean of 475


def run(tree: Path, preset: str, seed: int) -> dict[str, object]:
    """One whole process in a fresh directory; its wall time, env steps at the stop and the stop."""
    with tempfile.TemporaryDirectory(prefix="rlrun-wt-") as d:
        env = {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": d}
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "rlrun", f"+experiment={preset}", f"seed={seed}", "progress=false"],
                           cwd=d, capture_output=True, text=True, env=env, timeout=1800)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{preset} seed {seed} ({tree}) failed:\n{p.stderr[-2000:]}")
        # the run's own record of its last iteration (d30185c prints no summary with progress=false)
        last = json.loads(next(Path(d).rglob("metrics.jsonl")).read_text().splitlines()[-1])
    ret = float(last.get("rollout/episode_return_mean", float("nan")))
    return {"wall_s": round(wall, 2), "env_steps": int(last["timesteps_total"]), "return": round(ret, 1),
            "met": ret >= TARGET}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="an exported tree of d30185c (issue 34's day)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--name", default="walltime")
    args = ap.parse_args()
    settings = [("dqn_cartpole, d30185c", args.before, "dqn_cartpole"), ("dqn_cartpole", REPO, "dqn_cartpole"),
                ("rainbow_cartpole", REPO, "rainbow_cartpole")]
    rows: list[dict[str, object]] = []
    for seed in args.seeds:
        for who, tree, preset in settings:
            row = {"who": who, "seed": seed, **run(tree, preset, seed)}
            print(row, flush=True)
            rows.append(row)
    write(rows, [s[0] for s in settings], args.name)


def write(rows: list[dict[str, object]], order: list[str], name: str) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    base = statistics.median(float(r["wall_s"]) for r in rows if r["who"] == order[0])
    lines = [f"# Issue 34's wall-time lines, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/dqn_cartpole_tuning/walltime.py` ({os.cpu_count()} cores): whole process to a "
             "100-episode mean of 475 (each preset's stop and env-step budget), MLflow record included, settings "
             "alternating.", "",
             "| who | seeds: s (env steps at the stop) | reached 475 | median s | / d30185c |",
             "| --- | --- | --- | --- | --- |"]
    for who in order:
        mine = [r for r in rows if r["who"] == who]
        med = statistics.median(float(r["wall_s"]) for r in mine)
        runs = " / ".join(f"{r['wall_s']} ({int(str(r['env_steps'])):,})" for r in mine)
        lines.append(f"| {who} | {runs} | {sum(bool(r['met']) for r in mine)} of {len(mine)} | {med:.1f} | "
                     f"{med / base:.2f} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, order, out / f"{name}.png")


def plot(rows: list[dict[str, object]], order: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, who in enumerate(order):
        mine = [r for r in rows if r["who"] == who]
        ax.bar([i + 0.25 * k for k in range(len(mine))], [float(r["wall_s"]) for r in mine], width=0.22,
               color=[f"C{i}" if r["met"] else "lightgrey" for r in mine], label=who)
    ax.set_xticks([i + 0.25 for i in range(len(order))], order)
    ax.set_ylabel("wall time to 475 (s), per seed (grey: missed)")
    ax.set_title("CartPole-v1: issue 34's wall-time lines")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
