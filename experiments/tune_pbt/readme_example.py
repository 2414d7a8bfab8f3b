"""The README's population-based training example (``tune.run(PPOTrainer, ...)``, 4 trials, 6 iterations
of 1,000 env steps, a perturbation every 2) timed with a whole CPU per trial (Tune's default for
rlrun's trainers) and with RLlib's ``num_cpus_for_driver: 0.5`` (all 4 trials at once on 2 cores).

    python experiments/tune_pbt/readme_example.py --repeats 2 --name readme_pbt_2026-11-30

Each run is a fresh process in a fresh temp directory, removed after it (its own ``mlflow.db``, Ray's files);
the two settings alternate. Writes results/<name>.md and .csv (wall time of each run, the processes
that hosted trials, the best trial's return) and results/<name>.png (wall time per run and setting).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = {"1 CPU a trial (default)": {}, "num_cpus_for_driver 0.5": {"num_cpus_for_driver": 0.5}}
SCRIPT = """
import os, sys, json
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from rlrun import PPOTrainer

pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2,
                              hyperparam_mutations={"lr": [1e-4, 3e-4, 1e-3], "clip_param": [0.1, 0.2, 0.3]})
analysis = tune.run(PPOTrainer, name="pbt_ppo", scheduler=pbt, num_samples=4, metric="episode_reward_mean",
                    mode="max", config={"env": "CartPole-v1", "train_batch_size": 1000, "num_sgd_iter": 5,
                                        **json.loads(sys.argv[1])},
                    stop={"training_iteration": 6}, storage_path=os.path.abspath("ray_results"))
print("BEST", analysis.best_result["episode_reward_mean"], flush=True)
"""


def run_once(extra: dict[str, float]) -> dict[str, float]:
    import json

    with tempfile.TemporaryDirectory(prefix="readme-pbt-") as d:  # short: Ray's socket paths under it
        tmp = Path(d) / "tmp"
        tmp.mkdir()
        env = {**os.environ, "RAY_TMPDIR": str(tmp), "TMPDIR": str(tmp)}
        start = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(extra)], cwd=d, env=env, capture_output=True,
                           text=True, timeout=1800)
        wall = time.perf_counter() - start
        out = p.stdout + p.stderr
        if p.returncode != 0:
            raise SystemExit(f"the example failed (exit {p.returncode}):\n{out[-3000:]}")
        best = re.search(r"^BEST (\S+)", p.stdout, re.M)
        # Ray prefixes each trial process's lines with "(PPOTrainer pid=N)": how many processes hosted trials
        pids = set(re.findall(r"\(PPOTrainer pid=(\d+)\)", out))
        return {"wall_s": wall, "trial_processes": float(len(pids)), "best_return": float(best.group(1)) if best else
                float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    rows = []
    for i in range(args.repeats):
        order = list(SETTINGS) if i % 2 == 0 else list(reversed(SETTINGS))
        for setting in order:
            r = run_once(SETTINGS[setting])
            rows.append({"repeat": i, "setting": setting, **r})
            print(f"repeat {i} {setting}: {r['wall_s']:.1f} s, {r['trial_processes']:.0f} trial processes, "
                  f"best return {r['best_return']:.1f}", flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = {s: statistics.median(r["wall_s"] for r in rows if r["setting"] == s) for s in SETTINGS}
    base = med[next(iter(SETTINGS))]
    lines = [f"# The README's PBT example, {args.name}", "",
             f"`python experiments/tune_pbt/readme_example.py --repeats {args.repeats} --name {args.name}`", "",
             "| setting | wall s per run | median | x default | trial processes per run | best return per run |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        mine = [r for r in rows if r["setting"] == s]

        def each(key: str, fmt: str, mine: list[dict[str, object]] = mine) -> str:
            return ", ".join(format(r[key], fmt) for r in mine)

        lines.append(f"| {s} | {each('wall_s', '.1f')} | {med[s]:.1f} | {med[s] / base:.2f} | "
                     f"{each('trial_processes', '.0f')} | {each('best_return', '.1f')} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k, s in enumerate(SETTINGS):
        ys = [r["wall_s"] for r in rows if r["setting"] == s]
        ax.scatter([k] * len(ys), ys, label=s)
        ax.hlines(med[s], k - 0.2, k + 0.2)
    ax.set_xticks(range(len(SETTINGS)), list(SETTINGS))
    ax.set_ylabel("wall time of the example, s")
    ax.set_ylim(bottom=0)
    ax.set_title("README PBT example: 4 trials on 2 cores")
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
