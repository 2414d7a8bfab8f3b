"""Learning-regression suite: every preset x N seeds -> a table and a learning-curve plot per preset.

For each run: did it reach its target, final return, env steps and wall time to stop, the
iteration's throughput (median `time/env_steps_per_s`: env steps sampled per second of a whole
iteration) and the learner's (median `time/learn_throughput`: minibatch rows trained per second of
learning). `ppo_cartpole_ray2` runs PPO with the same 2 Ray workers as `appo_cartpole`, so the two
compare like for like.
Writes results/<name>.md, results/<name>.csv and results/curves_<preset>.png (<name>_curves_<preset>.png
with --name other than latest), and logs them as
artifacts of one MLflow run (experiment "regression") in results/mlflow.db.

    python experiments/regression/run.py --seeds 0 1 2                 # every preset
    python experiments/regression/run.py --seeds 0 --presets dqn_cartpole a2c_cartpole
    python experiments/regression/run.py --seeds 0 1 --presets appo_cartpole --override algo.gamma=0.99 --name x

"largest fall": the most the 100-episode mean dropped below its best so far on the way (a preset that
reaches its target only after losing what it had learned is one bad seed from missing it).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRESETS: dict[str, list[str]] = {
    "ppo_cartpole": ["+experiment=ppo_cartpole"],
    "pg_cartpole": ["+experiment=pg_cartpole"],
    "a2c_cartpole": ["+experiment=a2c_cartpole"],
    "dqn_cartpole": ["+experiment=dqn_cartpole"],
    "rainbow_cartpole": ["+experiment=rainbow_cartpole"],
    "ppo_pendulum": ["+experiment=ppo_pendulum"],
    "appo_cartpole": ["+experiment=appo_cartpole"],
    "ppo_cartpole_ray2": ["+experiment=ppo_cartpole", "rollout=ray", "rollout.num_workers=2"],
    # multi-agent: the return is an episode's summed over all agents
    "ppo_multi_cartpole": ["+experiment=ppo_multi_cartpole"],
    "ppo_rps": ["+experiment=ppo_rps"],
    "ppo_simple_spread": ["+experiment=ppo_simple_spread"],
    # customisation: a recurrent model on a wrapped env; a CNN on MiniGrid images
    "ppo_lstm_stateless_cartpole": ["+experiment=ppo_lstm_stateless_cartpole"],
    "ppo_minigrid_empty": ["+experiment=ppo_minigrid_empty"],
}


def largest_fall(returns: list[float]) -> float:
    best, fall = float("-inf"), 0.0
    for r in returns:
        best = max(best, r)
        fall = max(fall, best - r)
    return fall


def one(preset: str, seed: int, overrides: list[str]) -> tuple[dict[str, object], list[tuple[float, float]]]:
    from rlrun.app.cli import compose
    from rlrun.app.runner import run

    with tempfile.TemporaryDirectory(prefix="rlrun-regression-") as out:  # checkpoints are not kept
        cfg = compose([*PRESETS[preset], *overrides, f"seed={seed}", "tracking=none", "progress=false",
                       f"output_dir={out}"])
        t0 = time.perf_counter()
        r = run(cfg)
        wall = time.perf_counter() - t0
        history = r.history  # read from the run's metric file, which goes with `out`
    m = r.metrics
    curve = [(h["timesteps_total"], h["rollout/episode_return_mean"]) for h in history]
    sampled = [h["time/env_steps_per_s"] for h in history[1:]] or [0.0]
    trained = [h["time/learn_throughput"] for h in history[1:]] or [0.0]
    row = {"preset": preset, "seed": seed, "target_met": r.target_met,
           "final_return": round(m["rollout/episode_return_mean"], 1),
           "largest_fall": round(largest_fall([c[1] for c in curve]), 1), "env_steps": int(m["timesteps_total"]),
           "train_time_s": round(m["time_total_s"], 1), "wall_s": round(wall, 1),
           "env_steps_per_s": round(statistics.median(sampled)),
           "learn_rows_per_s": round(statistics.median(trained)), "stop": r.stop_reason}
    return row, curve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument("--name", default="latest", help="file stem for the table")
    ap.add_argument("--override", nargs="*", default=[], help="overrides added to every run (key=value ...)")
    args = ap.parse_args()
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    rows, curves = [], {}
    for preset in args.presets:
        for seed in args.seeds:
            row, curve = one(preset, seed, args.override)
            rows.append(row)
            curves.setdefault(preset, {})[seed] = curve
            print(row, flush=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| preset | seed | target met | final return | largest fall | env steps | train time (s) | wall (s) | "
             "env steps/s | learn rows/s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['preset']} | {r['seed']} | {r['target_met']} | {r['final_return']} | {r['largest_fall']} | "
              f"{r['env_steps']:,} | "
              f"{r['train_time_s']} | {r['wall_s']} | {r['env_steps_per_s']:,} | {r['learn_rows_per_s']:,} |"
              for r in rows]
    extra = f", overrides {' '.join(args.override)}" if args.override else ""
    lines.append(f"\n{time.strftime('%Y-%m-%d')}, seeds {args.seeds}{extra}")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = []
    for preset, by_seed in curves.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for seed, curve in by_seed.items():
            ax.plot([c[0] for c in curve], [c[1] for c in curve], label=f"seed {seed}")
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return (mean of last 100)")
        ax.set_title(preset)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        stem = "curves" if args.name == "latest" else f"{args.name}_curves"  # a named run keeps the plots of record
        path = out / f"{stem}_{preset}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        plots.append(path)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("regression")
    exp_id = exp.experiment_id if exp else client.create_experiment(
        "regression", artifact_location=(out / "mlartifacts").as_uri())
    run = client.create_run(exp_id, run_name=args.name)
    for path in [out / f"{args.name}.md", out / f"{args.name}.csv", *plots]:
        client.log_artifact(run.info.run_id, str(path))
    client.set_terminated(run.info.run_id)
    print(f"MLflow run {run.info.run_id} in {out / 'mlflow.db'}")


if __name__ == "__main__":
    main()
