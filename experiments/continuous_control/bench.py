"""SAC and TD3 on Pendulum-v1: rlrun against Stable-Baselines3 with rl-zoo3's hyperparameters, same
session, same stop. Two measurements:

1. **Time to target, whole process**: ``rlrun +experiment=sac_pendulum`` (or ``td3_pendulum``) as a
   user runs it, MLflow record complete when it returns, against SB3's SAC (TD3) in a fresh Python
   process. Both evaluate greedily every 1,024 env steps (10 episodes on 10 envs) and stop when the
   mean reaches -200, or at rl-zoo's 20k-step budget.
2. **Learner updates per second**: one update = one minibatch of 256 replayed rows through critic,
   actor (and temperature) losses and optimizer steps, plus the target update; rlrun's learn hook
   against SB3's ``model.train(gradient_steps, batch_size=256)``, the same nets, a filled buffer,
   torch on one thread and on two (SB3's default is one thread per core).

Writes results/<name>.md, results/<name>.csv and results/<name>.png.

    python experiments/continuous_control/bench.py --seeds 0 1 2 --name pendulum_2026-11-26
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
STOPPED = re.compile(r"^rlrun: stopped: (\S+) = ([-\d.]+)", re.M)
STEPS = re.compile(r"^\s+env steps\s+([\d,]+)", re.M)
TARGET, BUDGET = -200.0, 20_000

# rl-zoo3 2.9.2 hyperparams/sac.yml and td3.yml, Pendulum-v1
SB3_ALGOS = {
    "sac": 'SAC("MlpPolicy", env, learning_rate=1e-3, seed=SEED, device="cpu", verbose=0)',
    # SB3 with sac_pendulum's own settings (64-unit nets, lr 3e-3): where rlrun's preset gains from its settings
    "sac_preset": ('SAC("MlpPolicy", env, learning_rate=3e-3, policy_kwargs=dict(net_arch=[64, 64]), seed=SEED, '
                   'device="cpu", verbose=0)'),
    "td3": ('TD3("MlpPolicy", env, learning_rate=1e-3, gamma=0.98, buffer_size=200_000, learning_starts=10_000, '
            'action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)), gradient_steps=1, train_freq=1, '
            'policy_kwargs=dict(net_arch=[400, 300]), seed=SEED, device="cpu", verbose=0)'),
}
SB3_RUN = """
import json
import numpy as np
import torch
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import NormalActionNoise
SEED, BUDGET, TARGET = {seed}, {budget}, {target}
env = make_vec_env("Pendulum-v1", n_envs=1, seed=SEED)
eval_env = make_vec_env("Pendulum-v1", n_envs=10, seed=SEED + 10_000)
model = {algo}

class Evaluate(BaseCallback):  # rlrun's presets: greedy, 10 episodes on 10 envs, every 1,024 env steps
    met, last = None, float("nan")
    def _on_step(self):
        if self.num_timesteps % 1024 == 0:
            Evaluate.last, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)
            if Evaluate.last >= TARGET:
                Evaluate.met = self.num_timesteps
                return False
        return True

model.learn(total_timesteps=BUDGET, callback=Evaluate())
print(json.dumps({{"env_steps": Evaluate.met or model.num_timesteps, "return": float(Evaluate.last),
                   "target_met": Evaluate.met is not None}}))
"""

UPDATES_RLRUN = """
import time, numpy as np, torch, gymnasium as gym
torch.set_num_threads({threads})
from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.core.registry import MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.sources.plugins import load_builtins
load_builtins()
algo, hid = "{algo}", {hiddens}
cfg = MODELS.entry("twin_q_mlp").config_cls(hiddens=hid, critic_hiddens=hid,
                                            action_dist="deterministic" if algo == "td3" else "squashed_gaussian")
a_cfg = get_algorithm(algo).config_cls(learning_starts=0)
p = make_policy(algo, gym.spaces.Box(-8, 8, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32),
                model_config=cfg, algo_config=a_cfg)
rng, n = np.random.default_rng(0), 10_000
rows = SB({{SB.OBS: rng.standard_normal((n, 3)).astype(np.float32),
           SB.ACTIONS: rng.uniform(-2, 2, (n, 1)).astype(np.float32),
           SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 3)).astype(np.float32),
           SB.NSTEP_REWARDS: rng.standard_normal(n).astype(np.float32),
           SB.NSTEP_DISCOUNT: np.full(n, 0.99, np.float32)}})
learn = get_algorithm(algo).learn
learn(p, rows.slice(slice(0, 100)), LearnContext(n, 0))  # 100 updates of warm-up
p.state.replay.add(SB({{k: rows[k] for k in rows}}))  # 10k more rows in the buffer
t = time.perf_counter(); st = learn(p, rows.slice(slice(0, 2000)), LearnContext(n, 1)); dt = time.perf_counter() - t
print(st["train/num_sgd_steps"] / dt)
"""
UPDATES_SB3 = """
import time, numpy as np, torch
torch.set_num_threads({threads})
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.noise import NormalActionNoise
SEED = 0
env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
model = {model}
model.learn(total_timesteps={fill})  # past learning_starts: fills the buffer, trains a little
t = time.perf_counter(); model.train(gradient_steps=2000, batch_size=256); dt = time.perf_counter() - t
print(2000 / dt)
"""


# rlrun with rl-zoo3's SAC settings (256-unit nets, lr 1e-3, two torch threads: sac_pendulum before 2026-11-27)
RLZOO_SAC = ("model.hiddens=[256,256]", "model.critic_hiddens=[256,256]", "algo.lr=1e-3", "torch_threads=2")
# (who, algo): what runs besides the preset as it is against SB3 with rl-zoo3's settings
VARIANTS = {("rlrun (rl-zoo settings)", "sac"): RLZOO_SAC, ("sb3 (preset settings)", "sac"): "sac_preset"}


def run_rlrun(preset: str, seed: int, overrides: tuple[str, ...] = ()) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rlrun-cc-") as d:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "rlrun", f"+experiment={preset}", f"seed={seed}", *overrides], cwd=d,
                           capture_output=True, text=True, env={**ENV, "TMPDIR": d}, timeout=3600)
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"rlrun {preset} seed {seed} failed:\n{p.stderr[-2000:]}")
    stop, steps = STOPPED.search(p.stdout), STEPS.search(p.stdout)
    assert stop and steps, p.stdout[-2000:]
    met = stop[1] == "eval/episode_return_mean"
    return {"wall_s": round(wall, 2), "env_steps": int(steps[1].replace(",", "")),
            "return": float(stop[2]) if met else float("nan"), "target_met": met}


def run_sb3(algo: str, seed: int, settings: str | None = None) -> dict[str, object]:
    code = SB3_RUN.format(seed=seed, budget=BUDGET, target=TARGET, algo=SB3_ALGOS[settings or algo])
    with tempfile.TemporaryDirectory(prefix="rlrun-cc-") as d:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True,
                           env={**ENV, "TMPDIR": d}, timeout=3600)
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"sb3 {algo} seed {seed} failed:\n{p.stderr[-2000:]}")
    return {"wall_s": round(wall, 2), **json.loads(p.stdout.strip().splitlines()[-1])}


def updates_per_s(who: str, algo: str, threads: int) -> float:
    if who == "rlrun":
        code = UPDATES_RLRUN.format(threads=threads, algo=algo, hiddens=[256, 256] if algo == "sac" else [400, 300])
    else:
        code = UPDATES_SB3.format(threads=threads, model=SB3_ALGOS[algo].replace("SEED", "0"),
                                  fill=10_100 if algo == "td3" else 1_100)
    with tempfile.TemporaryDirectory(prefix="rlrun-cc-") as d:
        p = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True,
                           env={**ENV, "TMPDIR": d}, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{who} {algo} updates failed:\n{p.stderr[-2000:]}")
    return float(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--algos", nargs="+", default=["sac", "td3"], choices=["sac", "td3"])
    ap.add_argument("--updates-repeats", type=int, default=3)
    ap.add_argument("--variants", action="store_true", help="also rlrun with rl-zoo's SAC settings and SB3 with "
                    "sac_pendulum's (VARIANTS)")
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    for algo in args.algos:
        for seed in args.seeds:  # interleaved: both see the same machine load
            whos = ["rlrun", "sb3"] + [w for w, a in VARIANTS if a == algo and args.variants]
            for who in whos:
                extra = VARIANTS.get((who, algo))
                if who.startswith("rlrun"):
                    got = run_rlrun(f"{algo}_pendulum", seed, tuple(extra or ()))
                else:
                    got = run_sb3(algo, seed, extra if isinstance(extra, str) else None)
                row = {"kind": "to_target", "algo": algo, "who": who, "seed": seed, **got}
                rows.append(row)
                print(row, flush=True)
        for threads in (1, 2):
            for rep in range(args.updates_repeats):
                for who in ("rlrun", "sb3"):
                    row = {"kind": "updates", "algo": algo, "who": who, "threads": threads, "repeat": rep,
                           "updates_per_s": round(updates_per_s(who, algo, threads), 1)}
                    rows.append(row)
                    print(row, flush=True)
    write(rows, args.name)


def write(rows: list[dict[str, object]], name: str) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# SAC and TD3 on Pendulum-v1: rlrun vs SB3 (rl-zoo3 hyperparameters), {time.strftime('%Y-%m-%d')}", "",
             "`python experiments/continuous_control/bench.py` (this machine: "
             f"{os.cpu_count()} cores). Time to target: the whole process, greedy eval mean >= -200 "
             "(10 episodes every 1,024 env steps), budget 20k env steps; rlrun's includes its complete "
             "MLflow record, SB3 records nothing.", "",
             "| algo | who | seed | wall time (s) | env steps | greedy return | target met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["kind"] == "to_target":
            lines.append(f"| {r['algo']} | {r['who']} | {r['seed']} | {r['wall_s']} | {r['env_steps']:,} | "
                         f"{r['return']:.1f} | {r['target_met']} |")
    lines += ["", "| algo | who | median wall time (s) | / sb3 |", "| --- | --- | --- | --- |"]
    for algo in sorted({str(r["algo"]) for r in rows}):
        walls: dict[str, list[float]] = {}
        for r in rows:
            if r["kind"] == "to_target" and r["algo"] == algo:
                walls.setdefault(str(r["who"]), []).append(float(r["wall_s"]))
        sb3 = statistics.median(walls["sb3"])
        for who, w in sorted(walls.items()):
            lines.append(f"| {algo} | {who} | {statistics.median(w):.1f} | {statistics.median(w) / sb3:.2f} |")
    if any(r["kind"] == "updates" for r in rows):
        lines += ["", "Learner updates per second (median of the repeats; 256 rows a minibatch):", "",
                  "| algo | torch threads | rlrun | sb3 | rlrun / sb3 |", "| --- | --- | --- | --- | --- |"]
    for algo in sorted({str(r["algo"]) for r in rows if r["kind"] == "updates"}):
        for threads in (1, 2):
            ups: dict[str, list[float]] = {}
            for r in rows:
                if r["kind"] == "updates" and r["algo"] == algo and r["threads"] == threads:
                    ups.setdefault(str(r["who"]), []).append(float(r["updates_per_s"]))
            if "rlrun" in ups and "sb3" in ups:
                a, b = statistics.median(ups["rlrun"]), statistics.median(ups["sb3"])
                lines.append(f"| {algo} | {threads} | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, out / f"{name}.png")


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = sorted({str(r["algo"]) for r in rows})
    fig, axes = plt.subplots(1, len(algos), figsize=(5 * len(algos), 4), squeeze=False)
    for ax, algo in zip(axes[0], algos, strict=True):
        for i, who in enumerate(("rlrun", "sb3")):  # the preset as it is (rlrun) against SB3
            walls = [float(r["wall_s"]) for r in rows if r["kind"] == "to_target" and r["algo"] == algo
                     and r["who"] == who]
            ax.bar([i + 0.25 * k for k in range(len(walls))], walls, width=0.22, label=who)
        ax.set_xticks([0.25, 1.25], ["rlrun", "sb3"])
        ax.set_ylabel("wall time to greedy -200 (s), per seed")
        ax.set_title(f"{algo.upper()} Pendulum-v1")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
