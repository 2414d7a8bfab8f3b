"""Seat shuffling in tic-tac-toe: does a learner whose seats are shuffled each game (``env.shuffle_seats=true``)
play the second seat better than one trained in the first seat only, for the same env steps?

For each seed, ``ppo_tictactoe`` (PPO ``learned`` against the ``random`` heuristic) trains for ``--steps`` env steps
(its 0.9 target set out of reach) with the seats fixed (``learned`` always ``player_1``, moving first) and with the
seats shuffled; each checkpoint then plays ``--games`` greedy games with the seats shuffled, and each seat's mean
score of ``learned`` (win 1, loss -1) is recorded. Writes results/<name>.md, .csv and .png.

    python experiments/multi_agent/seats.py --seeds 0 1 2 --steps 200000 --name seats_2026-12-02
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEATS = ("player_1", "player_2")


def one_run(seed: int, shuffle: bool, steps: int, games: int) -> dict[str, object]:
    from rlrun.training.checkpoint import resolve_resume
    from rlrun.training.evaluation import evaluate_run
    from rlrun.training.export import load_policies

    with tempfile.TemporaryDirectory(prefix="rlrun-seats-") as d:
        subprocess.run([sys.executable, "-m", "rlrun", "+experiment=ppo_tictactoe", f"seed={seed}", "tracking=none",
                        "output_dir=run", "progress=false", f"env.shuffle_seats={str(shuffle).lower()}",
                        f"++stop={{rollout/learned/episode_return_mean: 2.0, timesteps_total: {steps}}}"],
                       cwd=d, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        path = resolve_resume("run", Path(d), None, Path(d) / "download", key="checkpoint")
        everyone = load_policies(path, Path(d))
        cfg = next(iter(everyone.values())).cfg
        cfg = replace(cfg, env=replace(cfg.env, shuffle_seats=True))
        res = evaluate_run({pid: lp.policy for pid, lp in everyone.items()}, cfg, games, 10, 0)
    by_seat = (res.seat_returns or {})["learned"]
    training = "shuffled" if shuffle else "fixed (player_1)"
    row: dict[str, object] = {"seed": seed, "training": training, "env_steps": steps}
    for seat in SEATS:
        row[f"{seat}_mean"] = round(float(np.mean(by_seat[seat])), 3)
        row[f"{seat}_games"] = len(by_seat[seat])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--games", type=int, default=400)
    ap.add_argument("--name", default="seats")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        for shuffle in (False, True):
            rows.append(one_run(seed, shuffle, args.steps, args.games))
            print(rows[-1], flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"`python experiments/multi_agent/seats.py --seeds {' '.join(map(str, args.seeds))} --steps {args.steps} "
             f"--games {args.games} --name {args.name}`: greedy mean score of `learned` against `random` in each seat "
             "(win 1, loss -1), the seats shuffled in evaluation", "",
             "| training | seed | env steps | moving first (player_1) | moving second (player_2) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['training']} | {r['seed']} | {r['env_steps']:,} | {r['player_1_mean']} "
                     f"({r['player_1_games']} games) | {r['player_2_mean']} ({r['player_2_games']} games) |")
    lines.append("")
    for training in ("fixed (player_1)", "shuffled"):
        sel = [r for r in rows if r["training"] == training]
        first, second = (statistics.median(r[f"{seat}_mean"] for r in sel) for seat in SEATS)
        lines.append(f"- {training}: median over the seeds, moving first {first}, moving second {second}")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k, training in enumerate(("fixed (player_1)", "shuffled")):
        sel = [r for r in rows if r["training"] == training]
        for j, seat in enumerate(SEATS):
            ax.scatter([j + 0.15 * (2 * k - 1)] * len(sel), [r[f"{seat}_mean"] for r in sel],
                       color=f"C{k}", label=training if j == 0 else None)
    ax.set_xticks(range(len(SEATS)), ["moving first (player_1)", "moving second (player_2)"])
    ax.set_ylabel(f"greedy mean score, {args.games} games")
    ax.set_title(f"tic-tac-toe against random, {args.steps:,} env steps")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
