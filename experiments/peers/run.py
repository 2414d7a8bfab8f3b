"""rlrun against its peers on the same tasks, interleaved in one benchmark run (issue 17).

Whole-process wall time from the command to the stop, and env steps to the target, per seed:

- ``ppo_cartpole``: ``rlrun +experiment=ppo_cartpole`` vs Stable-Baselines3 PPO (rl-zoo3 2.9.2
  hyperparameters), CartPole-v1 to a 100-episode mean return of 475;
- ``dqn_cartpole``: ``rlrun +experiment=dqn_cartpole`` vs SB3 DQN (rl-zoo3), same target;
- ``ppo_pendulum``: ``rlrun +experiment=ppo_pendulum`` vs SB3 PPO (rl-zoo3), Pendulum-v1 to -250;
- ``ppo_lstm_stateless_cartpole``: ``rlrun +experiment=ppo_lstm_stateless_cartpole`` vs sb3-contrib's
  RecurrentPPO (rl-zoo3's ``CartPoleNoVel-v1`` entry), CartPole-v1 with only the cart position and
  the pole angle observed, to 475;
- ``startup``: ``rlrun +experiment=ppo_cartpole stop.training_iteration=1`` (default tracking) vs
  ``python -c "import torch"``.

Every peer stops the way rlrun's presets do: at the first step where the mean return of the last
100 finished training episodes (SB3's ``ep_info_buffer``, 100 long) reaches the target, or at its
budget (``target_met`` false). Peers run as ``python -c`` processes of their own, so their wall time
includes their imports, as rlrun's includes its own. Runs are interleaved (task by task, seed by
seed, rlrun then its peers), so all see the same machine load. RLlib runs in a Python of its own
(``--rllib-python``): ``ray[rllib]`` 2.60 pins a gymnasium older than rlrun's, so it lives in a
separate virtual environment (README.md shows how to make it).

The peers' hyperparameters are rl-zoo3 2.9.2's ``hyperparams/ppo.yml`` / ``dqn.yml`` /
``ppo_lstm.yml`` entries for the env, copied into ``PEERS`` below; budgets and schedule horizons
are explained there.

    pip install -e ".[peers]"
    python experiments/peers/run.py [--seeds 0 1 2] [--tasks startup ppo_cartpole dqn_cartpole ppo_pendulum
        ppo_lstm_stateless_cartpole] [--rllib-python .venv-rllib/bin/python] [--name latest]

Writes results/latest.md, results/runs.csv and results/latest.png (with ``--name X``: X.md, X.csv
and X.png).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / "results"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
SUMMARY = re.compile(r"^rlrun: stopped: (.*?)(?: \(target met\))?\n\s+return\s+final ([\d.-]+).*\n"
                     r"\s+env steps\s+([\d,]+)", re.M)

# SB3 with rl-zoo3 2.9.2's hyperparameters. ``n_timesteps`` is rl-zoo's budget; where a 100-episode
# target needs more (a 475 mean needs the last 100 episodes to be ~47.5k steps alone), the budget
# is larger and what rl-zoo ties to the budget is kept in absolute steps: DQN's exploration
# (0.16 x 50k = 8k steps) and PPO CartPole's linear schedules (to 0 at 100k steps, then held at 0:
# SB3 reaches the target before that).
PEERS = {
    "ppo_cartpole": {"env": "CartPole-v1", "target": 475.0, "budget": 100_000, "code": """
model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=SEED), n_steps=32, batch_size=256,
            gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=lambda p: 1e-3 * p,
            clip_range=lambda p: 0.2 * p, seed=SEED, device="cpu")
"""},
    "dqn_cartpole": {"env": "CartPole-v1", "target": 475.0, "budget": 150_000, "code": """
model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=SEED), learning_rate=2.3e-3, batch_size=64,
            buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
            gradient_steps=128, exploration_fraction=8000 / BUDGET, exploration_final_eps=0.04,
            policy_kwargs=dict(net_arch=[256, 256]), seed=SEED, device="cpu")
"""},
    "ppo_pendulum": {"env": "Pendulum-v1", "target": -250.0, "budget": 500_000, "code": """
model = PPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=4, seed=SEED), n_steps=1024, gae_lambda=0.95,
            gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, use_sde=True,
            sde_sample_freq=4, seed=SEED, device="cpu")
"""},
    # rl-zoo's CartPoleNoVel-v1 is CartPole-v1 under its MaskVelocityWrapper, which zeroes entries 1
    # and 3 (the velocities), as here; rlrun's preset drops them (mask_observation keep [0, 2]). The
    # linear schedules end at rl-zoo's 100k budget and hold at 0 after it
    "ppo_lstm_stateless_cartpole": {"env": "CartPole-v1", "target": 475.0, "budget": 200_000, "code": """
import gymnasium as gym
from sb3_contrib import RecurrentPPO

class MaskVelocity(gym.ObservationWrapper):
    def observation(self, obs):
        return obs * np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)

def until_100k(start):
    return lambda p: start * max(0.0, 1.0 - (1.0 - p) * BUDGET / 100_000)

model = RecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=SEED, wrapper_class=MaskVelocity),
                     n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                     learning_rate=until_100k(1e-3), clip_range=until_100k(0.2), seed=SEED, device="cpu")
"""},
}

SB3_RUN = """
import json, time
import numpy as np
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
SEED, BUDGET, TARGET = {seed}, {budget}, {target}
{code}

class Stop(BaseCallback):
    met = None
    def _on_step(self):
        buf = self.model.ep_info_buffer
        if len(buf) == 100 and np.mean([e["r"] for e in buf]) >= TARGET:
            Stop.met = self.num_timesteps
            return False
        return True

model.learn(total_timesteps=BUDGET, callback=Stop())
mean = float(np.mean([e["r"] for e in model.ep_info_buffer])) if model.ep_info_buffer else float("nan")
print(json.dumps({{"env_steps": Stop.met or model.num_timesteps, "return": mean, "target_met": Stop.met is not None}}))
"""


# RLlib 2.60's PPO on CartPole-v1: PPOConfig's new-API-stack defaults (train_batch_size_per_learner 4000,
# minibatch 128, the default MLP) with the tuned example's lr 3e-4, 6 epochs and vf_loss_coeff 0.01
# (rllib/tuned_examples/ppo/cartpole_ppo.py at ray-2.60.0) and one env runner (one sampling process, as
# rlrun's preset samples in its own). The tuned example's own model (one hidden layer of 32 linear
# units, shared by the policy and value heads) with one env runner had not reached 475 after 457k env
# steps (seed 0, 2026-11-26): a peer that never reaches the target makes the ratio meaningless. The stop is the
# same as everyone's: the mean of the last 100 finished training episodes, which a callback collects
# from the env-runner processes (RLlib's own ``episode_return_mean`` merges the runners' windows).
RLLIB_RUN = """
import json, os
from collections import deque
import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
SEED, BUDGET, TARGET = {seed}, {budget}, {target}
RETURNS = os.path.abspath("returns.txt")

class Returns(RLlibCallback):
    def on_episode_end(self, *, episode, **kwargs):
        with open(RETURNS, "a") as f:  # env runners are processes of their own: O_APPEND lines
            f.write(f"{{episode.get_return()}}\\n")

open(RETURNS, "w").close()
ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
config = (PPOConfig().environment("CartPole-v1").debugging(seed=SEED).callbacks(Returns)
          .env_runners(num_env_runners=1)
          .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01))
algo = config.build_algo()
last, met, steps, seen = deque(maxlen=100), None, 0, 0
while met is None and steps < BUDGET:
    steps = int(algo.train()["num_env_steps_sampled_lifetime"])
    with open(RETURNS) as f:
        new = f.read().split()[seen:]
    seen += len(new)
    last.extend(float(x) for x in new)
    if len(last) == 100 and sum(last) / 100 >= TARGET:
        met = steps
algo.stop()
ray.shutdown()
print(json.dumps({{"env_steps": steps, "return": sum(last) / max(1, len(last)), "target_met": met is not None}}))
"""
RLLIB_BUDGET = {"ppo_cartpole": 500_000}


def timed(argv: list[str], cwd: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``argv`` with its output in files, as at a terminal; the time until the process exits."""
    out, err = Path(cwd) / "stdout.txt", Path(cwd) / "stderr.txt"
    with out.open("w") as fo, err.open("w") as fe:
        t0 = time.perf_counter()  # TMPDIR: SB3's logger writes a /tmp/SB3-<date> dir otherwise
        proc = subprocess.Popen(argv, cwd=cwd, stdout=fo, stderr=fe, env={**ENV, "TMPDIR": cwd})
        code = proc.wait(timeout=3600)
        wall = time.perf_counter() - t0
    return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text()), wall


def complete_after(wall: float, cwd: str) -> float:
    """Seconds from the command's start until MLflow holds the whole run: ``rlrun`` returns with its
    record complete, so this is its wall time, once the store says the run is FINISHED with its model
    (read right after the process exited, without waiting)."""
    con = sqlite3.connect(Path(cwd) / "mlflow.db")
    try:
        (status, run_id), = con.execute("select status, run_uuid from runs").fetchall()
        models = [r[0] for r in con.execute("select source_run_id from logged_models").fetchall()]
    finally:
        con.close()
    assert status == "FINISHED" and run_id in models, (status, models)
    return round(wall, 2)


def run_rlrun(task: str, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rlrun-peers-") as d:
        p, wall = timed([sys.executable, "-m", "rlrun", f"+experiment={task}", f"seed={seed}"], d)
        if p.returncode != 0:
            raise SystemExit(f"rlrun {task} seed {seed} failed:\n{p.stderr[-2000:]}")
        complete = complete_after(wall, d)
    m = SUMMARY.search(p.stdout)
    assert m, p.stdout[-1000:]
    return {"wall_s": round(wall, 2), "mlflow_complete_s": complete, "env_steps": int(m[3].replace(",", "")),
            "return": float(m[2]), "target_met": m[1].startswith("rollout/episode_return_mean")}


def run_sb3(task: str, seed: int) -> dict[str, object]:
    spec = PEERS[task]
    code = SB3_RUN.format(seed=seed, budget=spec["budget"], target=spec["target"], code=spec["code"])
    with tempfile.TemporaryDirectory(prefix="rlrun-peers-") as d:
        p, wall = timed([sys.executable, "-c", code], d)
    if p.returncode != 0:
        raise SystemExit(f"sb3 {task} seed {seed} failed:\n{p.stderr[-2000:]}")
    return {"wall_s": round(wall, 2), **json.loads(p.stdout.strip().splitlines()[-1])}


def run_rllib(task: str, seed: int, python: str) -> dict[str, object]:
    code = RLLIB_RUN.format(seed=seed, budget=RLLIB_BUDGET[task], target=PEERS[task]["target"])
    with tempfile.TemporaryDirectory(prefix="rlrun-peers-") as d:
        p, wall = timed([python, "-c", code], d)
    if p.returncode != 0:
        raise SystemExit(f"rllib {task} seed {seed} failed:\n{p.stderr[-2000:]}")
    return {"wall_s": round(wall, 2), **json.loads(p.stdout.strip().splitlines()[-1])}


def run_startup(seed: int) -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlrun-peers-") as d:
        p, wall = timed([sys.executable, "-m", "rlrun", "+experiment=ppo_cartpole", "stop.training_iteration=1",
                         f"seed={seed}"], d)
        assert p.returncode == 0, p.stderr[-2000:]
        rows.append({"task": "startup", "who": "rlrun 1 iteration", "seed": seed, "wall_s": round(wall, 2),
                     "mlflow_complete_s": complete_after(wall, d)})
        p, wall = timed([sys.executable, "-c", "import torch"], d)
        rows.append({"task": "startup", "who": "python -c 'import torch'", "seed": seed, "wall_s": round(wall, 2)})
    return rows


def median_of(rows: list[dict[str, object]], task: str, who: str, key: str = "wall_s") -> float:
    return statistics.median(float(r[key]) for r in rows if r["task"] == task and r["who"] == who)


def steps_per_s(rs: list[dict[str, object]]) -> float:
    """Whole-process env steps per second: the median over seeds of env steps / wall s."""
    return statistics.median(float(r["env_steps"]) / float(r["wall_s"]) for r in rs)  # type: ignore[arg-type]


def report(rows: list[dict[str, object]], name: str = "latest") -> None:
    RESULTS.mkdir(exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with (RESULTS / ("runs.csv" if name == "latest" else f"{name}.csv")).open("w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# rlrun vs peers: {name} run", "",
             "Wall s: from the command to the process's exit. For rlrun, MLflow complete s: until MLflow holds the "
             "whole run (`rlrun` returns once it does: the same time, checked in the store as the process exits).",
             "",
             "| task | who | median wall s | median s to MLflow complete | median env steps | env steps/s | "
             "targets met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    pairs = list(dict.fromkeys((str(r["task"]), str(r["who"])) for r in rows))
    for task, who in pairs:
        rs = [r for r in rows if r["task"] == task and r["who"] == who]
        steps = (f"{median_of(rows, task, who, 'env_steps'):,.0f}" if "env_steps" in rs[0] else "")
        rate = f"{steps_per_s(rs):,.0f}" if "env_steps" in rs[0] else ""
        met = f"{sum(bool(r.get('target_met')) for r in rs)}/{len(rs)}" if "target_met" in rs[0] else ""
        complete = f"{median_of(rows, task, who, 'mlflow_complete_s'):.1f}" if "mlflow_complete_s" in rs[0] else ""
        lines.append(f"| {task} | {who} | {median_of(rows, task, who):.1f} | {complete} | {steps} | {rate} | {met} |")
    lines += ["", "Ratios of medians (rlrun / peer; below 1: rlrun is faster):", ""]
    for task, who in pairs:
        if who not in ("rlrun", "rlrun 1 iteration"):
            mine = "rlrun 1 iteration" if task == "startup" else "rlrun"
            lines.append(f"- {task}: rlrun / {who} = {median_of(rows, task, mine) / median_of(rows, task, who):.2f}")
    if {("ppo_cartpole", "rlrun"), ("dqn_cartpole", "rlrun")} <= set(pairs):  # DQN's cost per env step
        ppo, dqn = (steps_per_s([r for r in rows if r["task"] == t and r["who"] == "rlrun"])
                    for t in ("ppo_cartpole", "dqn_cartpole"))
        lines.append(f"- rlrun env steps/s, ppo_cartpole / dqn_cartpole = {ppo / dqn:.1f}")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    plot(rows, pairs, name)
    print((RESULTS / f"{name}.md").read_text())


def plot(rows: list[dict[str, object]], pairs: list[tuple[str, str]], name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (task, who) in enumerate(pairs):
        ws = [float(r["wall_s"]) for r in rows if r["task"] == task and r["who"] == who]
        ax.scatter([i] * len(ws), ws, color="C0" if who.startswith("rlrun") else "C1")
        ax.hlines(statistics.median(ws), i - 0.3, i + 0.3, color="k")
    ax.set_xticks(range(len(pairs)), [f"{t}\n{w}" for t, w in pairs], fontsize=7)
    ax.set(ylabel="whole-process wall time (s)", yscale="log", title="rlrun vs peers, 2-core machine")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", nargs="+", default=["startup", "ppo_cartpole", "dqn_cartpole", "ppo_pendulum",
                                                   "ppo_lstm_stateless_cartpole"],
                    choices=["startup", *PEERS])
    ap.add_argument("--name", default="latest", help="file stem of the table and plot (the csv: runs.csv for latest)")
    ap.add_argument("--rllib-python", default=os.environ.get("RLLIB_PYTHON"),
                    help="a Python with ray[rllib]==2.60.0 installed (its own venv: see README.md); "
                         "RLlib runs the tasks in RLLIB_BUDGET")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []

    def add(*new: dict[str, object]) -> None:
        for row in new:  # every row as it comes: an interrupted benchmark keeps what it measured
            rows.append(row)
            print(json.dumps(row), flush=True)

    for task in args.tasks:
        for seed in args.seeds:
            if task == "startup":
                add(*run_startup(seed))
                continue
            add({"task": task, "who": "rlrun", "seed": seed, **run_rlrun(task, seed)})
            add({"task": task, "who": "sb3 (rl-zoo3)", "seed": seed, **run_sb3(task, seed)})
            if args.rllib_python and task in RLLIB_BUDGET:
                add({"task": task, "who": "rllib (1 env runner)", "seed": seed,
                     **run_rllib(task, seed, args.rllib_python)})
    report(rows, args.name)


if __name__ == "__main__":
    main()
