"""Multi-agent sampling throughput: agent steps/s of `ppo_multi_cartpole` vs single-agent CartPole-v1.

For each number of env copies C, in one process and interleaved round by round, this times
``worker.sample()`` (policy forward passes, env steps, postprocessing; no learning) of:

- ``multi_cartpole``: C copies of the 4-agent env, 2 policies (the ppo_multi_cartpole preset), all
  copies stepped at once in numpy (``VectorMultiCartPole``, the preset's default);
- ``multi_cartpole_sync``: the same, the copies stepped one by one as Parallel-API envs
  (``env.vectorize=sync``: the path every PettingZoo env takes);
- ``cartpole_numpy``: CartPole-v1 with C sub-envs, gymnasium's numpy-vectorised implementation
  (what ``+experiment=ppo_cartpole`` uses: ``env.vectorize=auto``);
- ``cartpole_sync``: CartPole-v1 with C sub-envs stepped one by one in Python (``env.vectorize=sync``),
  the same per-env Python stepping as the multi-agent env's.

Reports medians over rounds and the ratio multi / single; writes results/latest.md, .csv, .png.

    python experiments/multi_agent_throughput/bench.py [--copies 4 16 64] [--rounds 7] [--steps 64]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_worker(kind: str, copies: int, frag: int):
    from rlrun import make_trainer

    common = ["tracking=none", "progress=false", f"rollout.num_envs_per_worker={copies}",
              f"rollout.rollout_fragment_length={frag}", f"algo.train_batch_size={frag * copies}",
              "algo.sgd_minibatch_size=null"]
    if kind.startswith("multi_cartpole"):
        vec = "sync" if kind.endswith("sync") else "auto"
        trainer = make_trainer(["+experiment=ppo_multi_cartpole", f"env.vectorize={vec}", *common])
    else:
        vec = "auto" if kind == "cartpole_numpy" else "sync"
        trainer = make_trainer(["+experiment=ppo_cartpole", f"env.vectorize={vec}", *common])
    return trainer


def agent_steps(batch) -> int:
    return batch.agent_steps() if hasattr(batch, "agent_steps") else len(batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=64, help="env steps per copy per sample() call")
    args = ap.parse_args()
    kinds = ["multi_cartpole", "multi_cartpole_sync", "cartpole_numpy", "cartpole_sync"]
    rows = []
    for copies in args.copies:
        trainers = {k: make_worker(k, copies, args.steps) for k in kinds}
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        for k in kinds:  # warm up
            trainers[k].workers.local_worker.sample()
        for _ in range(args.rounds):
            for k in kinds:  # interleaved: the same machine load for each kind
                w = trainers[k].workers.local_worker
                t0 = time.perf_counter()
                n = agent_steps(w.sample())
                rates[k].append(n / (time.perf_counter() - t0))
        for k in kinds:
            trainers[k].stop()
        med = {k: statistics.median(v) for k, v in rates.items()}
        row = {"copies": copies, **{f"{k}_agent_steps_per_s": round(v) for k, v in med.items()},
               "multi_vs_numpy": round(med["multi_cartpole"] / med["cartpole_numpy"], 3),
               "multi_sync_vs_sync": round(med["multi_cartpole_sync"] / med["cartpole_sync"], 3)}
        rows.append(row)
        print(row, flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / "latest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| env copies | multi_cartpole, numpy (4 agents) | multi_cartpole, sync | CartPole, numpy | "
             "CartPole, sync | multi / single (numpy) | multi / single (sync) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['copies']} | {r['multi_cartpole_agent_steps_per_s']:,} | "
                     f"{r['multi_cartpole_sync_agent_steps_per_s']:,} | "
                     f"{r['cartpole_numpy_agent_steps_per_s']:,} | {r['cartpole_sync_agent_steps_per_s']:,} | "
                     f"{r['multi_vs_numpy']:.2f} | {r['multi_sync_vs_sync']:.2f} |")
    (out / "latest.md").write_text("\n".join(lines) + f"\n\nagent steps/s, median of {args.rounds} rounds of "
                                   f"sample() with {args.steps} env steps per copy\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k in kinds:
        ax.plot([r["copies"] for r in rows], [r[f"{k}_agent_steps_per_s"] for r in rows], marker="o", label=k)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("env copies (sub-envs)")
    ax.set_ylabel("agent steps / s (sampling only)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "latest.png", dpi=100)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
