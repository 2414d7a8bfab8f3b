"""Sampling throughput on CartPole-v1: env steps/s with the policy in the loop, no learning.

Grid: num_workers 0 (in-process), 1, 2 (Ray actors) x num_envs_per_worker 1, 8, 64. Each cell
builds the real WorkerSet from `+experiment=ppo_cartpole` overrides, warms up, then times rounds
of `workers.sample()` + `workers.sync_weights()` (what one training iteration does before
learning). Reports the median over rounds; writes results/latest.md, results/latest.csv and
results/latest.png.

    python experiments/sampling_throughput/bench.py [--rounds 7] [--rows 8192] [--vectorize auto envpool] \
        [--name latest]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(workers: int, envs: int, rows: int, rounds: int, vectorize: str = "auto") -> dict[str, object]:
    from rlrun import make_trainer

    frag = max(4, rows // envs)
    overrides = ["+experiment=ppo_cartpole", "tracking=none", f"rollout.num_envs_per_worker={envs}",
                 f"rollout.rollout_fragment_length={frag}", f"algo.train_batch_size={frag * envs * max(workers, 1)}",
                 f"env.vectorize={vectorize}"]
    if workers:
        overrides += ["rollout=ray", f"rollout.num_workers={workers}"]
    trainer = make_trainer(overrides)
    ws = trainer.workers
    try:
        for _ in range(2):
            ws.sample()
            ws.sync_weights()
        rates = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            n = sum(len(b) for b in ws.sample())
            ws.sync_weights()
            rates.append(n / (time.perf_counter() - t0))
    finally:
        trainer.stop()
    return {"vectorize": vectorize, "num_workers": workers, "num_envs_per_worker": envs,
            "rollout_fragment_length": frag,
            "env_steps_per_s": round(statistics.median(rates)), "min": round(min(rates)), "max": round(max(rates))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", type=int, default=8192, help="env steps per worker per round")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--vectorize", nargs="+", default=["auto"],
                    help="env.vectorize modes to compare: auto (gymnasium's numpy CartPole), envpool")
    ap.add_argument("--name", default="latest", help="file stem of the table, csv and plot under results/")
    args = ap.parse_args()
    rows = []
    for w in args.workers:
        for e in args.envs:
            for v in args.vectorize:  # modes interleaved cell by cell: both see the same machine load
                r = measure(w, e, args.rows, args.rounds, v)
                rows.append(r)
                print(r, flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    table = ["| env.vectorize | num_workers | num_envs_per_worker | fragment | env steps/s (median) | min | max |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    table += [f"| {r['vectorize']} | {r['num_workers']} | {r['num_envs_per_worker']} | "
              f"{r['rollout_fragment_length']} | "
              f"{r['env_steps_per_s']:,} | {r['min']:,} | {r['max']:,} |" for r in rows]
    table.append(f"\n{args.rounds} rounds per cell, {args.rows} env steps per worker per round; "
                 f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    (out / f"{args.name}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for w in args.workers:
        for v in args.vectorize:
            pts = [r for r in rows if r["num_workers"] == w and r["vectorize"] == v]
            ax.plot([r["num_envs_per_worker"] for r in pts], [r["env_steps_per_s"] for r in pts], marker="o",
                    linestyle="-" if v == "auto" else "--",
                    label=f"num_workers={w}" + (" (in-process)" if w == 0 else " (Ray)") + f", {v}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("num_envs_per_worker")
    ax.set_ylabel("env steps / s (median)")
    ax.set_title("CartPole-v1 sampling throughput, policy in the loop")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
