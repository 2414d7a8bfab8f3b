"""Two updates of one off-policy preset at rl-zoo's cadence on HalfCheetah-v5 (one env step, one 256-row update):
SAC's update compiled by torch.compile (``algo.compile_update``) against the eager hand-derived one (the default);
with ``--compare hand``, the hand-derived update (SAC's or TD3's, ``--algo``) against autograd's; with ``--compare
backends``, SAC's compiled update with its products on oneDNN against torch's BLAS (``torch_matmul_backend``).

One ``<algo>_halfcheetah`` trainer (no MLflow, no evaluation), its policy switched between the two updates (both
reading the same weights: ``sac_hand_stages`` on a ``CompiledTwinQGrad`` or a ``TwinQGrad``; or the algorithm's
hand-derived gradient and None, autograd; or one compiled update, the product backend switched) iteration by
iteration, in alternating order per pair; each iteration is ``--rounds`` rounds of one env step and one update.
Measured: the iteration's wall time per round (``time/iteration_s``), its sampling and learning parts, after any
compile and a warm-up. Writes results/<name>.md, .csv and .png.

    python experiments/continuous_control/compiled.py --pairs 8 --name compiled_2026-12-01
    python experiments/continuous_control/compiled.py --compare hand --algo td3 --pairs 8 --name td3_hand_2026-12-01
    python experiments/continuous_control/compiled.py --compare backends --pairs 10 --name compiled_backends_2026-12-07
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMPARE = {"compiled": ("compiled", "eager"), "hand": ("hand", "autograd"), "backends": ("onednn", "blas")}


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    import torch

    from rlrun.algos.algorithm import get_algorithm
    from rlrun.algos.sac import sac_hand_stages
    from rlrun.app.runner import make_trainer
    from rlrun.models import gemm
    from rlrun.models.twin_q_compiled import CompiledTwinQGrad
    from rlrun.models.twin_q_grad import TwinQGrad

    tr = make_trainer([f"+experiment={args.algo}_halfcheetah", "tracking=none", "progress=false", f"seed={args.seed}",
                       f"torch_threads={args.threads}", "algo.learning_starts=1024", "evaluation.interval=0",
                       f"min_sample_timesteps_per_iteration={args.rounds}"])
    p = tr.policy
    if args.compare == "backends":  # one compiled update (compiled again for the other backend, Dynamo's guard)
        compiled = sac_hand_stages(p, CompiledTwinQGrad(p.model, p.state.target_model))
        hands = {"onednn": compiled, "blas": compiled}
    elif args.compare == "compiled":
        hands = {"compiled": sac_hand_stages(p, CompiledTwinQGrad(p.model, p.state.target_model)),
                 "eager": sac_hand_stages(p, TwinQGrad(p.model, p.state.target_model))}
    else:
        hand = get_algorithm(args.algo).hand_gradient
        hands = {"hand": hand(p) if hand else None, "autograd": None}
        assert hands["hand"] is not None, f"{args.algo}_halfcheetah has no hand-derived gradient"
    modes = COMPARE[args.compare]
    def use(mode: str) -> None:
        p.hand_gradient = hands[mode]
        if args.compare == "backends":
            gemm.set_backend(mode)

    for i in range(2 * -(-1024 // args.rounds) + 4):  # the 1,024 random steps, any compile, a warm-up of each
        use(modes[i % 2])
        tr.train()
    rows: list[dict[str, object]] = []
    for pair in range(args.pairs):
        for mode in (modes if pair % 2 == 0 else modes[::-1]):
            use(mode)
            r = tr.train()
            ms = {k: r[f"time/{k}_s"] / args.rounds * 1e3 for k in ("iteration", "sample", "learn")}
            rows.append({"pair": pair, "mode": mode, "round_ms": round(ms["iteration"], 3),
                         "sample_ms": round(ms["sample"], 3), "learn_ms": round(ms["learn"], 3)})
            print(rows[-1], flush=True)
    assert torch.get_num_threads() == args.threads
    return rows


def write(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    a, b = modes = COMPARE[args.compare]
    by = {m: [r for r in rows if r["mode"] == m] for m in modes}
    ratios = [float(str(x["round_ms"])) / float(str(y["round_ms"])) for x, y in zip(by[a], by[b], strict=True)]
    what = {"compiled": "the update compiled against the eager one", "hand": "the hand-derived update against autograd",
            "backends": "the compiled update's products on oneDNN against torch's BLAS"}
    lines = [f"# {args.algo.upper()} on HalfCheetah-v5: {what[args.compare]}, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/continuous_control/compiled.py --compare {args.compare} --algo {args.algo} "
             f"--pairs {args.pairs} --rounds {args.rounds} --threads {args.threads} --seed {args.seed}` "
             f"({os.cpu_count()} cores, {args.threads} torch threads). One trainer, the two updates alternating "
             f"iteration by iteration; {args.rounds} rounds of one env step and one 256-row update an iteration.", "",
             "| update | round (ms), median | sampling (ms) | learning (ms) |", "| --- | --- | --- | --- |"]
    for m in modes:
        med = {k: statistics.median(float(str(r[k])) for r in by[m]) for k in ("round_ms", "sample_ms", "learn_ms")}
        lines.append(f"| {m} | {med['round_ms']:.2f} | {med['sample_ms']:.2f} | {med['learn_ms']:.2f} |")
    lines += ["", f"{a.capitalize()} / {b} round time, median of the {len(ratios)} pairs' ratios: "
              f"**{statistics.median(ratios):.3f}** (range {min(ratios):.3f}-{max(ratios):.3f})."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for m in modes:
        ax.plot([r["pair"] for r in by[m]], [r["round_ms"] for r in by[m]], "o-", label=m)
    ax.set_xlabel("pair")
    ax.set_ylabel("ms per round (env step + update)")
    ax.set_title(f"{args.algo.upper()} HalfCheetah-v5, rl-zoo's cadence")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", choices=list(COMPARE), default="compiled",
                    help="compiled: SAC's compiled update against the eager one; hand: hand-derived against autograd; "
                         "backends: the compiled update on oneDNN against torch's BLAS")
    ap.add_argument("--algo", choices=["sac", "td3"], default="sac")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=256, help="rounds (one env step, one update) an iteration")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=f"compiled_{time.strftime('%Y-%m-%d')}")
    args = ap.parse_args()
    write(measure(args), args)


if __name__ == "__main__":
    main()
