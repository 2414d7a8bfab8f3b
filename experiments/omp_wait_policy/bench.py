"""How long a preset that learns on two torch threads takes alone and with a second copy beside it on the
same cores, with torch's OpenMP threads spinning while they wait for work (OpenMP's default) and sleeping
(``OMP_WAIT_POLICY=PASSIVE``, what the test suite sets: it runs two test processes side by side).

    python experiments/omp_wait_policy/bench.py --repeats 3 --name dqn_cartpole_2026-11-30

Each run is ``rlrun +experiment=dqn_cartpole`` (``torch_threads: 2``) for 20k env steps with
``tracking=none``, a fresh process in a fresh temp directory; "pair" starts two such runs at once and
records each one's wall time. The four settings rotate their order every repeat. Writes
results/<name>.md and .csv (wall time of every run) and results/<name>.png.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICIES = {"spin (default)": None, "PASSIVE": "PASSIVE"}
SETTINGS = [(copies, policy) for copies in (1, 2) for policy in POLICIES]
ARGS = ["+experiment=dqn_cartpole", "seed=0", "stop.timesteps_total=20000", "tracking=none", "progress=false"]


def run_copies(copies: int, policy: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    value = POLICIES[policy]
    if value is not None:
        env["OMP_WAIT_POLICY"] = value
    with tempfile.TemporaryDirectory(prefix="omp-wait-") as d:

        def one(k: int) -> float:  # each run's own wall time, from its start to its exit
            start = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "rlrun", *ARGS, f"output_dir={d}/run{k}"], cwd=d, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"rlrun failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
            return time.perf_counter() - start

        with ThreadPoolExecutor(copies) as pool:
            return list(pool.map(one, range(copies)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    rows = []
    for i in range(args.repeats):
        order = SETTINGS[i % len(SETTINGS):] + SETTINGS[:i % len(SETTINGS)]
        for copies, policy in order:
            walls = run_copies(copies, policy)
            rows += [{"repeat": i, "copies": copies, "wait_policy": policy, "run": k, "wall_s": round(w, 2)}
                     for k, w in enumerate(walls)]
            print(f"repeat {i}, {copies} at once, {policy}: " + ", ".join(f"{w:.1f} s" for w in walls), flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    def walls(copies: int, policy: str) -> list[float]:
        return [r["wall_s"] for r in rows if r["copies"] == copies and r["wait_policy"] == policy]

    base = statistics.median(walls(1, "spin (default)"))
    lines = [f"# dqn_cartpole (torch_threads 2, 20k env steps) alone and in pairs, {args.name}", "",
             f"`python experiments/omp_wait_policy/bench.py --repeats {args.repeats} --name {args.name}`", "",
             "| runs at once | OpenMP wait | wall s per run | median | x one alone, spinning |",
             "| --- | --- | --- | --- | --- |"]
    for copies, policy in SETTINGS:
        ws = walls(copies, policy)
        med = statistics.median(ws)
        lines.append(f"| {copies} | {policy} | {', '.join(f'{w:.1f}' for w in ws)} | {med:.1f} | {med / base:.2f} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k, (copies, policy) in enumerate(SETTINGS):
        ws = walls(copies, policy)
        ax.scatter([k] * len(ws), ws)
        ax.hlines(statistics.median(ws), k - 0.2, k + 0.2)
    ax.set_xticks(range(len(SETTINGS)), [f"{c} at once\n{p}" for c, p in SETTINGS])
    ax.set_ylabel("wall time of a run, s")
    ax.set_ylim(bottom=0)
    ax.set_title("dqn_cartpole on 2 torch threads, 20k env steps")
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
