"""Does the compiled SAC update (``algo.compile_update``) compute the eager one's gradients along a real run?

One ``sac_halfcheetah`` trainer (no MLflow, no evaluation) learns with the eager hand-derived update
(``TwinQGrad``); at every update the compiled one (``CompiledTwinQGrad``) first computes both stages' gradients
from the same weights, minibatch and noise (the policy's generator is rewound between the two), and the two are
compared: per tensor, the largest absolute difference over the largest absolute eager value, the worst tensor per
stage. Where the actor stage differs by more than 1e-3, the two critics' Q-values at the sampled actions are
checked for a near tie: where |Q1 - Q2| is within the two updates' rounding (1e-5 of |Q| here), the compiled
critics may make the other one the minimum, and the actor's gradient for that row then goes through the other
critic (both are subgradients of the minimum). Writes results/<name>.md, .csv (one row per update) and .png.

    python experiments/continuous_control/agreement.py --steps 30000 --name agreement_2026-12-01
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NEAR_TIE = 1e-5  # |Q1 - Q2| / |Q| within which the two updates' rounding can order the critics either way


def worst(compiled: list[Any], eager: list[Any]) -> float:
    """The largest per-tensor max |compiled - eager| / max |eager|."""
    return max(float((c - e).abs().max()) / max(float(e.abs().max()), 1e-12) for c, e in zip(compiled, eager,
                                                                                             strict=True))


def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    import torch

    from rlrun.algos.sac import sac_hand_stages
    from rlrun.app.runner import make_trainer
    from rlrun.models.twin_q_compiled import CompiledTwinQGrad
    from rlrun.models.twin_q_grad import TwinQGrad

    tr = make_trainer(["+experiment=sac_halfcheetah", "tracking=none", "progress=false", f"seed={args.seed}",
                       "algo.compile_update=false", f"torch_threads={args.threads}", "evaluation.interval=0",
                       f"stop.timesteps_total={args.steps}"])
    p = tr.policy
    st: Any = p.state
    eager = TwinQGrad(p.model, st.target_model)
    e_critic, e_actor = sac_hand_stages(p, eager)
    c_critic, c_actor = sac_hand_stages(p, CompiledTwinQGrad(p.model, st.target_model))
    critic_params, actor_params = list(p.model.critic_parameters()), list(p.model.actor_parameters())
    rows: list[dict[str, float]] = []
    row: dict[str, float] = {}

    def critic(batch: Any) -> Any:
        rng = p.generator.get_state()
        c_critic(batch)
        compiled = [q.grad.clone() for q in critic_params]
        p.generator.set_state(rng)
        out = e_critic(batch)
        row.clear()
        row.update(update=st.num_updates, critic_rel=worst(compiled, [q.grad for q in critic_params]))
        return out

    def actor(batch: Any) -> Any:
        obs, _, sample, n = eager._pending
        a = sample.a[n:].clone()
        c_actor(batch)
        compiled = [q.grad.clone() for q in actor_params]
        out = e_actor(batch)
        rel = worst(compiled, [q.grad for q in actor_params])
        ties, gap = -1, -1.0
        if rel > 1e-3:
            with torch.no_grad():
                q = p.model.q(obs, a)
            spread = (q.amax(0) - q.amin(0)) / q.abs().amax(0).clamp_min(1e-12)
            ties, gap = int((spread <= NEAR_TIE).sum()), float(spread.min())
        rows.append({**row, "actor_rel": rel, "near_ties": ties, "min_gap_rel": gap, "env_steps": p.global_timestep})
        return out

    p.hand_gradient = (critic, actor)
    from rlrun.policy.loss import stages_of

    p.stages = stages_of(p.loss_fn, p.optimizer, p.hand_gradient, p.spec.loss.name, p.hooks.name)
    started = time.perf_counter()
    while p.global_timestep < args.steps:
        tr.train()
        if rows:
            print(f"{p.global_timestep} env steps, {len(rows)} updates, {time.perf_counter() - started:.0f} s",
                  flush=True)
    return rows


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def write(rows: list[dict[str, float]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# SAC on HalfCheetah-v5: the compiled update's gradients against the eager one's, "
             f"{time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/continuous_control/agreement.py --steps {args.steps} --seed {args.seed} --threads "
             f"{args.threads}` ({os.cpu_count()} cores). One `sac_halfcheetah` run learning with the eager update; at "
             f"each of its {len(rows):,} updates both updates' gradients from the same weights, minibatch and noise. "
             "Per update, the worst tensor's max |compiled - eager| / max |eager|.", "",
             "| stage | median | 99th percentile | 99.9th percentile | max | updates > 1e-3 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for stage in ("critic", "actor"):
        xs = [r[f"{stage}_rel"] for r in rows]
        lines.append(f"| {stage} | {quantile(xs, 0.5):.1e} | {quantile(xs, 0.99):.1e} | {quantile(xs, 0.999):.1e} | "
                     f"{max(xs):.1e} | {sum(x > 1e-3 for x in xs)} |")
    far = [r for r in rows if r["actor_rel"] > 1e-3]
    lines += ["", f"Actor stages more than 1e-3 apart: {len(far)}; with a near tie between the two critics' Q-values "
              f"(|Q1 - Q2| <= {NEAR_TIE:g} |Q|) on some row of the minibatch: {sum(r['near_ties'] > 0 for r in far)}."]
    lines += [f"- update {int(r['update'])} (env step {int(r['env_steps'])}): {r['actor_rel']:.2e}; "
              f"{int(r['near_ties'])} near-tied row(s), smallest |Q1 - Q2| / |Q| {r['min_gap_rel']:.1e}" for r in far]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for stage in ("critic", "actor"):
        ax.plot([r["update"] for r in rows], [max(r[f"{stage}_rel"], 1e-9) for r in rows], ".", ms=1.5,
                label=f"{stage} stage")
    ax.set_yscale("log")
    ax.set_xlabel("update")
    ax.set_ylabel("max |compiled - eager| / max |eager|")
    ax.set_title("SAC on HalfCheetah-v5: compiled against eager gradients, same state")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=120)
    print((out / f"{args.name}.md").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30_000, help="env steps (updates start at 10,000)")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="agreement")
    args = ap.parse_args()
    write(measure(args), args)


if __name__ == "__main__":
    main()
