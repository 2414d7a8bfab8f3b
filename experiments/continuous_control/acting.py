"""SAC acting in numpy against torch on HalfCheetah-v5 at the preset's cadence (one env step, one update).

At rl-zoo's cadence every env step is a round of its own: the actor acts on one row, the env steps,
the fragment is finished, then one 256-row update. ``twin_q_mlp``'s actor acts in numpy
(``rlrun.models.numpy_actor.NumpyNet``) on views of its weights; this measures what that buys, in one
process, against the same policy with its numpy actor switched off (the torch forward pass):

1. ``compute_actions`` on one observation (exploring), blocks of 2,000 calls, the two interleaved;
2. rounds of ``sac_halfcheetah`` (``Trainer.train()``: 1,024 rounds of one env step and one update, after
   1,000 random steps), the two alternating iteration by iteration: ms per env step of the whole
   iteration, of its sampling and of its learning (``time/sample_s``, ``time/learn_s``).

Writes results/<name>.md, .csv and .png.

    python experiments/continuous_control/acting.py --pairs 6 --name acting_2026-11-29
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def call_us(policy: Any, obs: np.ndarray, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        policy.compute_actions(obs, True)
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="acting_latest")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlrun-acting-") as d:
        rows = measure(args, d)
    write(rows, args)


def measure(args: argparse.Namespace, out_dir: str) -> list[dict[str, object]]:
    from rlrun.app.runner import make_trainer

    trainer = make_trainer(["+experiment=sac_halfcheetah", "algo.learning_starts=1000", "evaluation.interval=0",
                            "checkpoint.every_n_iters=0", f"torch_threads={args.threads}", "progress=false",
                            "tracking=none", f"output_dir={out_dir}"], launch_dir=out_dir)
    torch.set_num_threads(args.threads)
    policy = trainer.policy
    state = policy.state
    actor = state.actor
    assert actor is not None, "the preset's twin_q_mlp should act in numpy"
    modes = {"numpy": actor, "torch": None}
    rows: list[dict[str, object]] = []
    policy.global_timestep = 10**9  # past learning_starts: the actor acts
    obs = np.random.default_rng(0).standard_normal((1, 17)).astype(np.float32)
    for rep in range(5):
        for mode in (modes if rep % 2 == 0 else reversed(modes)):
            state.actor = modes[mode]
            rows.append({"measure": "compute_actions_us", "mode": mode, "repeat": rep,
                         "value": round(call_us(policy, obs, 2000), 2)})
    policy.global_timestep = trainer.timesteps_total
    state.actor = actor
    trainer.train()  # 1,024 random env steps (learning starts at 1,000)
    trainer.train()
    for rep in range(args.pairs):
        for mode in (modes if rep % 2 == 0 else reversed(modes)):
            state.actor = modes[mode]
            t = time.perf_counter()
            r = trainer.train()
            wall = time.perf_counter() - t
            n = float(r["rollout/env_steps_this_iter"])
            for measure, v in (("round_ms", wall), ("sample_ms", r["time/sample_s"]), ("learn_ms", r["time/learn_s"])):
                rows.append({"measure": measure, "mode": mode, "repeat": rep, "value": round(v / n * 1e3, 3)})
            print(rows[-3:], flush=True)
    trainer.stop()
    return rows


def write(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    def values(measure: str, mode: str) -> list[float]:
        return [float(str(r["value"])) for r in rows if r["measure"] == measure and r["mode"] == mode]

    def pair_ratio(measure: str) -> float:
        return statistics.median(a / b for a, b in zip(values(measure, "numpy"), values(measure, "torch"), strict=True))

    lines = [f"# SAC HalfCheetah-v5: acting in numpy against torch, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/continuous_control/acting.py --pairs {args.pairs} --threads {args.threads}` "
             f"({os.cpu_count()} cores). One process; the two modes interleaved (medians; ratio: the median of "
             "the pairs' ratios).", "",
             "| measure | numpy | torch | numpy / torch |", "| --- | --- | --- | --- |"]
    names = {"compute_actions_us": "`compute_actions`, one row (us a call)", "round_ms": "round: ms per env step",
             "sample_ms": "... of which sampling (ms)", "learn_ms": "... of which learning (ms)"}
    for measure, label in names.items():
        lines.append(f"| {label} | {statistics.median(values(measure, 'numpy')):.3f} | "
                     f"{statistics.median(values(measure, 'torch')):.3f} | {pair_ratio(measure):.3f} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, measure in zip(axes, ("compute_actions_us", "sample_ms"), strict=True):
        ax.boxplot([values(measure, "numpy"), values(measure, "torch")], tick_labels=["numpy", "torch"])
        ax.set_title(names[measure], fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
