"""Prioritized replay's cost per learner step: one ``sample`` of 128 rows plus one
``update_priorities`` of them, for buffers of 10k, 100k and 1M rows (CartPole-sized rows), with
rlrun's 16-ary sum tree against the same vectorised code on a binary tree (fan-out 2, the usual
layout: 20 levels for 1M rows). Median of --repeats blocks of 1,000 calls.

Writes results/<name>.md, results/<name>.csv and results/<name>.png.

    python experiments/prioritized_replay/bench.py --name per_2026-11-26
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import rlrun.data.prioritized as per
from rlrun.data.batch import SampleBatch as SB

HERE = Path(__file__).resolve().parent
SIZES = (10_000, 100_000, 1_000_000)


def set_fanout(f: int) -> None:
    per.FANOUT, per._ONES, per._UPPER = f, np.ones(f), np.triu(np.ones((f, f)))


def per_call_us(size: int, fanout: int, repeats: int) -> float:
    set_fanout(fanout)
    rng = np.random.default_rng(0)
    buf = per.PrioritizedReplayBuffer(size, seed=0)
    buf.add(SB({SB.OBS: rng.standard_normal((size, 4)).astype(np.float32), SB.ACTIONS: rng.integers(0, 2, size),
                SB.NSTEP_NEXT_OBS: rng.standard_normal((size, 4)).astype(np.float32),
                SB.NSTEP_REWARDS: np.ones(size, np.float32), SB.NSTEP_DISCOUNT: np.full(size, 0.99, np.float32)}))
    buf.update_priorities(np.arange(size), rng.random(size))
    times = []
    for _ in range(repeats):
        td = rng.standard_normal((1000, 128))
        t = time.perf_counter()
        for i in range(1000):
            rows = buf.sample(128, beta=0.4)
            buf.update_priorities(rows[SB.BATCH_INDEXES], td[i])
        times.append((time.perf_counter() - t) / 1000 * 1e6)
    return statistics.median(times)


def uniform_us(size: int, repeats: int) -> float:
    """The same 128-row sample from rlrun's uniform ReplayBuffer: the row reads any replay pays."""
    from rlrun.data.replay import ReplayBuffer

    rng = np.random.default_rng(0)
    buf = ReplayBuffer(size, seed=0)
    buf.add(SB({SB.OBS: rng.standard_normal((size, 4)).astype(np.float32), SB.ACTIONS: rng.integers(0, 2, size),
                SB.NSTEP_NEXT_OBS: rng.standard_normal((size, 4)).astype(np.float32),
                SB.NSTEP_REWARDS: np.ones(size, np.float32), SB.NSTEP_DISCOUNT: np.full(size, 0.99, np.float32)}))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(1000):
            buf.sample(128)
        times.append((time.perf_counter() - t) / 1000 * 1e6)
    return statistics.median(times)


def cpu_model() -> str:
    """The processor's name (the cost depends on it: a 1M-row tree does or does not fit the caches)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    rows = []
    for size in SIZES:
        for fanout in (16, 2):
            us = per_call_us(size, fanout, args.repeats)
            rows.append({"rows": size, "fanout": fanout, "us_per_sample_and_update": round(us, 1)})
            print(rows[-1], flush=True)
        rows.append({"rows": size, "fanout": 0, "us_per_sample_and_update": round(uniform_us(size, args.repeats), 1)})
        print(rows[-1], flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Prioritized replay: sample + update of 128 rows, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/prioritized_replay/bench.py --repeats {args.repeats}` (median of "
             f"{args.repeats} blocks of 1,000 calls; one process, numpy). Processor: {cpu_model()}, "
             f"{os.cpu_count()} cores.", "",
             "| buffer rows | 16-ary tree (rlrun), us | binary tree, us | binary / 16-ary | uniform replay's "
             "sample alone, us |", "| --- | --- | --- | --- | --- |"]
    for size in SIZES:
        a, b = (next(r["us_per_sample_and_update"] for r in rows if r["rows"] == size and r["fanout"] == f)
                for f in (16, 2))
        u = next(r["us_per_sample_and_update"] for r in rows if r["rows"] == size and r["fanout"] == 0)
        lines.append(f"| {size:,} | {a} | {b} | {b / a:.2f} | {u} |")
    lines += ["", "fanout 0 in the CSV: the uniform buffer (no tree)."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for f, label in ((16, "16-ary (rlrun)"), (2, "binary"), (0, "uniform replay, sample only")):
        ax.plot(SIZES, [r["us_per_sample_and_update"] for r in rows if r["fanout"] == f], "o-", label=label)
    ax.axhline(200, color="grey", ls="--", label="issue 34's budget (0.2 ms)")
    ax.set_xscale("log")
    ax.set_xlabel("buffer rows")
    ax.set_ylabel("us per sample + update (128 rows)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
