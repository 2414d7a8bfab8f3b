"""PPO on Atari Breakout: how fast rlrun samples and trains, against Stable-Baselines3's PPO with the
same rl-zoo3 settings (8 envs x 128 steps, 4 epochs of 256-row minibatches, the Nature CNN), in the
same session on the same machine.

For each: --steps env steps of ALE/Breakout-v5 (frameskip 1 in the env, 4 in the preprocessing,
84x84 grey, 4 frames stacked, sticky actions on), seed 0, a fresh process.

- sampling env steps/s: env steps over the time spent collecting them (env steps, preprocessing and
  the policy's forward pass); rlrun: the iterations' ``time/sample_s``; SB3: the time between its
  ``on_rollout_start`` and ``on_rollout_end`` callbacks.
- training env steps/s: env steps over the time of the whole training loop (collecting and
  learning); rlrun: the iterations' ``time/iteration_s``; SB3: ``model.learn``.
- whole process: env steps over the wall time from the command to its exit (rlrun's includes its
  complete MLflow record, ``tracking.wait=true``; SB3 records nothing).

Environment wrappers differ where the libraries do: SB3's ``make_atari_env`` adds episodic life and
fire-on-reset (a few more resets); rlrun's preset uses gymnasium's ``AtariPreprocessing``.

Writes results/<name>.md, results/<name>.csv and results/<name>.png.

    python experiments/atari/bench.py --steps 20480 --name breakout_2026-11-27
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SB3_RUN = """
import json, time, torch
import ale_py, gymnasium
gymnasium.register_envs(ale_py)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

torch.set_num_threads({threads})
class Clock(BaseCallback):
    def __init__(self):
        super().__init__()
        self.sampling = 0.0
    def _on_rollout_start(self):
        self.t = time.perf_counter()
    def _on_rollout_end(self):
        self.sampling += time.perf_counter() - self.t
    def _on_step(self):
        return True

env = VecFrameStack(make_atari_env("ALE/Breakout-v5", n_envs=8, seed=0, env_kwargs={{"frameskip": 1}}), n_stack=4)
model = PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4, clip_range=0.1,
            ent_coef=0.01, vf_coef=0.5, seed=0, device="cpu", verbose=0)
clock = Clock()
t = time.perf_counter()
model.learn(total_timesteps={steps}, callback=clock)
train = time.perf_counter() - t
print(json.dumps({{"env_steps": model.num_timesteps, "sample_s": clock.sampling, "train_s": train}}))
"""


def run_rlrun(steps: int, threads: int) -> dict[str, object]:
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory(prefix="rlrun-atari-") as d:
        cmd = [sys.executable, "-m", "rlrun", "+experiment=ppo_breakout", f"stop.timesteps_total={steps}", "seed=0",
               f"torch_threads={threads}", "progress=false", "tracking.wait=true"]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env={**os.environ, "TMPDIR": d})
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"rlrun failed:\n{p.stderr[-2000:]}")
        client = MlflowClient(f"sqlite:///{d}/mlflow.db")
        (run,) = client.search_runs([client.get_experiment_by_name("ppo_breakout").experiment_id])
        rid = run.info.run_id
        sample = sum(m.value for m in client.get_metric_history(rid, "time/sample_s"))
        iteration = sum(m.value for m in client.get_metric_history(rid, "time/iteration_s"))
        env_steps = int(run.data.metrics["timesteps_total"])
    return {"who": f"rlrun ({threads} torch thread{'s' if threads > 1 else ''})", "env_steps": env_steps,
            "sampling_steps_per_s": round(env_steps / sample), "training_steps_per_s": round(env_steps / iteration),
            "whole_process_steps_per_s": round(env_steps / wall), "wall_s": round(wall, 1)}


def run_sb3(steps: int, threads: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rlrun-atari-") as d:
        t = time.perf_counter()
        # TMPDIR: SB3's logger and torch's compile cache write to the temporary directory, not /tmp
        p = subprocess.run([sys.executable, "-c", SB3_RUN.format(steps=steps, threads=threads)], cwd=d,
                           capture_output=True, text=True, env={**os.environ, "TMPDIR": d})
        wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"sb3 failed:\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"who": f"sb3 ({threads} torch thread{'s' if threads > 1 else ''})", "env_steps": r["env_steps"],
            "sampling_steps_per_s": round(r["env_steps"] / r["sample_s"]),
            "training_steps_per_s": round(r["env_steps"] / r["train_s"]),
            "whole_process_steps_per_s": round(r["env_steps"] / wall), "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20480)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    rows = []
    for threads in args.threads:  # rlrun and SB3 alternate, so a slow spell of the machine hits both
        for run in (run_rlrun, run_sb3):
            rows.append(run(args.steps, threads))
            print(rows[-1], flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# PPO on Breakout: env steps per second, rlrun vs SB3, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/atari/bench.py --steps {args.steps}` (seed 0, one run each, this machine; "
             "rl-zoo3's PPO settings for both).", "",
             "| who | env steps | sampling, steps/s | training, steps/s | whole process, steps/s | wall (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['who']} | {r['env_steps']:,} | {r['sampling_steps_per_s']:,} | {r['training_steps_per_s']:,} | "
              f"{r['whole_process_steps_per_s']:,} | {r['wall_s']} |" for r in rows]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("sampling_steps_per_s", "training_steps_per_s", "whole_process_steps_per_s")
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([k + i * width for k in range(len(keys))], [r[k] for k in keys], width, label=r["who"])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], ["sampling", "training", "whole process"])
    ax.set_ylabel("env steps per second")
    ax.set_title(f"PPO on Breakout, {args.steps:,} env steps")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
