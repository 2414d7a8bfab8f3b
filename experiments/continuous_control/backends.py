"""HalfCheetah-v5 SAC time per 10k env steps in repeated rounds of three runs, each alone: rlrun's preset as it is
(``torch_matmul_backend: auto``), rlrun with torch's BLAS for every product (``torch_matmul_backend=blas``: the
code before ``rlrun/models/gemm.py``), and Stable-Baselines3 with rl-zoo3's hyperparameters, seed 0, 40,960 env
steps, two torch threads each (as the preset and SB3 run by default). Each round runs the three in another order
(forward, reversed, forward, ...), so a drift of this shared machine falls on each of them. Measured as
``halfcheetah.py`` measures it (from the first evaluation past 20k env steps to the last); the table gives each
round's times and ratios, and the medians.

    python experiments/continuous_control/backends.py --rounds 3 --name backends_2026-12-07

``--from-kept PREFIX`` runs nothing and reads the halves ``halfcheetah.py --only ... --name PREFIX_<arm>_p<round>``
wrote (results/PREFIX_<arm>_p<round>.<who>-0.json, arms ``auto``, ``blas``, ``sb3``).

Writes results/<name>.md, results/<name>.csv and results/<name>.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import halfcheetah as hc  # noqa: E402  (the sibling script: its runs and its measure)

ARMS = ("auto", "blas", "sb3")
STEPS, THREADS, SEED = 40_960, 2, 0


def run_arm(arm: str) -> tuple[list[dict[str, float]], float]:
    t = time.perf_counter()
    if arm == "sb3":
        return hc.sb3_curve(hc.run_sb3("sac", SEED, STEPS, THREADS), t)
    overrides = ("torch_matmul_backend=blas",) if arm == "blas" else ()
    return hc.rlrun_curve(hc.run_rlrun("sac", SEED, STEPS, THREADS, overrides), t)


def kept(prefix: str, arm: str, rnd: int) -> tuple[list[dict[str, float]], float]:
    who = "sb3" if arm == "sb3" else "rlrun"
    data = json.loads((HERE / "results" / f"{prefix}_{arm}_p{rnd}.{who}-{SEED}.json").read_text())
    return data["curve"], data["wall_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--from-kept", metavar="PREFIX", help="run nothing: read halfcheetah.py's kept halves")
    ap.add_argument("--name", default="backends")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    for rnd in range(1, args.rounds + 1):
        for arm in (ARMS if rnd % 2 else ARMS[::-1]):
            curve, wall = kept(args.from_kept, arm, rnd) if args.from_kept else run_arm(arm)
            rows.append({"round": rnd, "arm": arm, "s_per_10k": round(hc.per_10k(curve), 1), "wall_s": round(wall, 1),
                         "final_return": round(curve[-1]["return"], 1)})
            print(rows[-1], flush=True)
    write(rows, args)


def write(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    t = {(r["round"], r["arm"]): float(str(r["s_per_10k"])) for r in rows}
    rounds = sorted({int(str(r["round"])) for r in rows})
    how = (f"--from-kept {args.from_kept}` (halves run by halfcheetah.py, see the study's README)" if args.from_kept
           else f"--rounds {args.rounds}`")
    day = time.strftime("%Y-%m-%d")
    lines = [f"# SAC on HalfCheetah-v5, time per 10k env steps: rlrun (auto, blas) and SB3, {day}",
             "", f"`python experiments/continuous_control/backends.py {how}. Seed 0, {STEPS:,} env steps, "
             f"{THREADS} torch threads, each run alone; s per 10k env steps from 20k on.", "",
             "| round | rlrun auto | rlrun blas | SB3 | auto / SB3 | blas / SB3 | auto / blas |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    ratios: dict[str, list[float]] = {"auto/sb3": [], "blas/sb3": [], "auto/blas": []}
    for rnd in rounds:
        a, b, s = t[rnd, "auto"], t[rnd, "blas"], t[rnd, "sb3"]
        for k, v in (("auto/sb3", a / s), ("blas/sb3", b / s), ("auto/blas", a / b)):
            ratios[k].append(v)
        lines.append(f"| {rnd} | {a} | {b} | {s} | {a / s:.2f} | {b / s:.2f} | {a / b:.2f} |")
    med = {arm: statistics.median(t[rnd, arm] for rnd in rounds) for arm in ARMS}
    lines.append(f"| median | {med['auto']:.1f} | {med['blas']:.1f} | {med['sb3']:.1f} | "
                 + " | ".join(f"**{statistics.median(v):.2f}**" for v in ratios.values()) + " |")
    lines += ["", "The median row's ratios are the medians of the rounds' ratios."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, label in (("auto", "rlrun (auto)"), ("blas", "rlrun (blas)"), ("sb3", "SB3")):
        ax.plot(rounds, [t[rnd, arm] for rnd in rounds], "o-", label=label)
    ax.set_xlabel("round")
    ax.set_xticks(rounds)
    ax.set_ylabel("s per 10k env steps")
    ax.set_ylim(bottom=0)
    ax.set_title("SAC, HalfCheetah-v5, seed 0, two threads")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
