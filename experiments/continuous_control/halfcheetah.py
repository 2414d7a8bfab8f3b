"""SAC (or TD3) on HalfCheetah-v5 for 200k env steps: rlrun's preset against Stable-Baselines3 with
the same (rl-zoo3) hyperparameters, same session. The two runs go side by side, each on one torch
thread (a 2-core machine: one core each, so both see the same load; run them one after the other
with --one-by-one). Both evaluate greedily every 10,240 env steps and at the last one (10 episodes on
10 envs; rlrun's final evaluation: ``evaluation.final``, on by default since 2026-11-28).

Measured: the greedy return at each evaluation (the learning curve), the return at 200k env steps,
and the wall time per 10k env steps once learning has started (from 20k to the end), which is most
of what a user waits for on MuJoCo. rlrun's run is the CLI as a user types it (its MLflow record
complete when it returns); SB3's records nothing.

Writes results/<name>.md, results/<name>.csv and results/<name>.png, and each half's curve as soon as
it ends (results/<name>.<who>-<seed>.json). ``--only rlrun|sb3`` runs one half (e.g. each pinned to a
core of its own with ``taskset``); ``--combine`` then writes one table and plot from the kept halves.

    python experiments/continuous_control/halfcheetah.py --algo sac --seeds 0 --name halfcheetah_sac_2026-11-26
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
REPO = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
EVERY = 10_240  # env steps between greedy evaluations (the presets' evaluation.interval 160 x 64)

# rl-zoo3 2.9.2 hyperparams/sac.yml and td3.yml, HalfCheetah-v4 (mujoco defaults); v5 is the same task
SB3_ALGOS = {
    "sac": 'SAC("MlpPolicy", env, learning_starts=10_000, seed=SEED, device="cpu", verbose=0)',
    "td3": ('TD3("MlpPolicy", env, learning_rate=1e-3, learning_starts=10_000, batch_size=256, train_freq=1, '
            'gradient_steps=1, action_noise=NormalActionNoise(np.zeros(6), 0.1 * np.ones(6)), '
            'policy_kwargs=dict(net_arch=[400, 300]), seed=SEED, device="cpu", verbose=0)'),
}
SB3_RUN = """
import json, sys, time
import numpy as np
import torch
torch.set_num_threads({threads})
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import NormalActionNoise
SEED, STEPS, EVERY = {seed}, {steps}, {every}
t0 = time.perf_counter()
env = make_vec_env("HalfCheetah-v5", n_envs=1, seed=SEED)
eval_env = make_vec_env("HalfCheetah-v5", n_envs=10, seed=SEED + 10_000)
model = {algo}

class Evaluate(BaseCallback):  # as rlrun's presets: greedy, 10 episodes on 10 envs, every 10,240 env steps
    def _on_step(self):
        if self.num_timesteps % EVERY == 0 or self.num_timesteps == STEPS:
            ret, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)
            print(json.dumps({{"env_steps": self.num_timesteps, "wall_s": time.perf_counter() - t0,
                               "return": float(ret)}}), flush=True)
        return True

model.learn(total_timesteps=STEPS, callback=Evaluate())
"""


def run_rlrun(algo: str, seed: int, steps: int, threads: int, overrides: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    d = tempfile.mkdtemp(prefix="rlrun-hc-")
    cmd = [sys.executable, "-m", "rlrun", f"+experiment={algo}_halfcheetah", f"seed={seed}", f"torch_threads={threads}",
           f"stop.timesteps_total={steps}", "progress=false", *overrides, f"output_dir={d}/out"]
    return subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "TMPDIR": d})


def rlrun_curve(p: subprocess.Popen[str], started: float) -> tuple[list[dict[str, float]], float]:
    _, err = p.communicate()
    wall = time.perf_counter() - started
    d = Path(p.args[-1].split("=", 1)[1]).parent  # type: ignore[index]
    if p.returncode != 0:
        raise SystemExit(f"rlrun failed:\n{err[-3000:]}")
    rows = [json.loads(line) for line in (d / "out" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    t_start = wall - rows[-1]["time_total_s"]  # the process's start-up before the first iteration
    curve = [{"env_steps": r["timesteps_total"], "wall_s": t_start + r["time_total_s"],
              "return": r["eval/episode_return_mean"]} for r in rows if "eval/episode_return_mean" in r]
    subprocess.run(["rm", "-rf", str(d)], check=True)
    return curve, wall


def run_sb3(algo: str, seed: int, steps: int, threads: int) -> subprocess.Popen[str]:
    code = SB3_RUN.format(seed=seed, steps=steps, every=EVERY, threads=threads, algo=SB3_ALGOS[algo])
    d = tempfile.mkdtemp(prefix="rlrun-hc-")
    return subprocess.Popen([sys.executable, "-c", code, d], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**ENV, "TMPDIR": d})


def sb3_curve(p: subprocess.Popen[str], started: float) -> tuple[list[dict[str, float]], float]:
    out, err = p.communicate()
    wall = time.perf_counter() - started
    subprocess.run(["rm", "-rf", str(p.args[-1])], check=True)  # type: ignore[index]
    if p.returncode != 0:
        raise SystemExit(f"sb3 failed:\n{err[-3000:]}")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], wall


def keep(args: argparse.Namespace, who: str, seed: int, result: tuple[list[dict[str, float]], float]) -> None:
    """One half's curve and wall time as soon as it ends: results/<name>.<who>-<seed>.json."""
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    curve, wall = result
    (out / f"{args.name}.{who}-{seed}.json").write_text(json.dumps({"wall_s": wall, "curve": curve}))


def per_10k(curve: list[dict[str, float]], start: int = 20_000) -> float:
    """Seconds per 10k env steps from the first evaluation past ``start`` to the last one."""
    a = next((c for c in curve if c["env_steps"] >= start), curve[0])  # a short run: its first evaluation
    b = curve[-1]
    if b["env_steps"] == a["env_steps"]:
        return float("nan")
    return (b["wall_s"] - a["wall_s"]) / (b["env_steps"] - a["env_steps"]) * 10_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", default="sac", choices=list(SB3_ALGOS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one-by-one", action="store_true", help="run rlrun, then SB3 (default: side by side)")
    ap.add_argument("--only", choices=["rlrun", "sb3"], help="run one half (the other from another session or run)")
    ap.add_argument("--rlrun-override", action="append", default=[], help="a Hydra override for rlrun's half")
    ap.add_argument("--combine", nargs="+", type=Path, metavar="JSON",
                    help="run nothing: one table and plot from halves already kept (results/<name>.<who>-<seed>.json)")
    ap.add_argument("--name", default="latest")
    args = ap.parse_args()
    if args.combine:
        write([row_of(args.algo, *kept(path)) for path in args.combine], args)
        return
    halves = [args.only] if args.only else ["rlrun", "sb3"]
    start = {"rlrun": lambda seed: run_rlrun(args.algo, seed, args.steps, args.threads, tuple(args.rlrun_override)),
             "sb3": lambda seed: run_sb3(args.algo, seed, args.steps, args.threads)}
    curve_of = {"rlrun": rlrun_curve, "sb3": sb3_curve}
    rows: list[dict[str, object]] = []
    for seed in args.seeds:
        got = {}
        if args.one_by_one:
            for who in halves:
                t = time.perf_counter()
                got[who] = curve_of[who](start[who](seed), t)
                keep(args, who, seed, got[who])
        else:
            t = time.perf_counter()
            procs = {who: start[who](seed) for who in halves}
            for who in halves:
                got[who] = curve_of[who](procs[who], t)
                keep(args, who, seed, got[who])  # on disk at once: the other half may take much longer
        for who, result in got.items():
            rows.append(row_of(args.algo, who, seed, result))
            print({k: v for k, v in rows[-1].items() if k != "curve"}, flush=True)
    write(rows, args)


def row_of(algo: str, who: str, seed: int, result: tuple[list[dict[str, float]], float]) -> dict[str, object]:
    curve, wall = result
    return {"algo": algo, "who": who, "seed": seed, "wall_s": round(wall, 1), "s_per_10k": round(per_10k(curve), 1),
            "final_return": round(curve[-1]["return"], 1), "final_steps": int(curve[-1]["env_steps"]),
            "curve": json.dumps(curve)}


def kept(path: Path) -> tuple[str, int, tuple[list[dict[str, float]], float]]:
    """A half ``keep`` wrote: its who and seed (from the name ``<name>.<who>-<seed>.json``), curve and wall time."""
    who, seed = path.name.removesuffix(".json").rsplit(".", 1)[1].rsplit("-", 1)
    data = json.loads(path.read_text())
    return who, int(seed), (data["curve"], data["wall_s"])


def write(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.combine:  # how each half ran is in its own results' table
        command = f"--combine {' '.join(str(p) for p in args.combine)}` (halves run before, each with its own command)"
    else:
        how = "one after the other" if args.one_by_one else "side by side, one core each"
        extra = "".join(f" --rlrun-override {o}" for o in args.rlrun_override)
        extra += f" --only {args.only}" if args.only else ""
        command = (f"--seeds {' '.join(map(str, args.seeds))} --steps {args.steps}{extra}` ({os.cpu_count()} cores; "
                   f"{args.threads} torch thread(s) each, {how})")
    title = f"{args.algo.upper()} on HalfCheetah-v5: rlrun vs SB3 (rl-zoo3 hyperparameters)"
    lines = [f"# {title}, {time.strftime('%Y-%m-%d')}",
             "", f"`python experiments/continuous_control/halfcheetah.py --algo {args.algo} {command}. "
             "Greedy return: 10 episodes every 10,240 env steps. "
             "Time per 10k env steps: from the first evaluation past 20k env steps to the last.", "",
             "| who | seed | greedy return at the end | env steps | s per 10k env steps | whole run (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['who']} | {r['seed']} | {r['final_return']} | {r['final_steps']:,} | {r['s_per_10k']} | "
                     f"{r['wall_s']} |")
    for seed in sorted({r["seed"] for r in rows}):
        mine = {r["who"]: r for r in rows if r["seed"] == seed}
        if "rlrun" in mine and "sb3" in mine:
            lines.append("")
            ratio = float(str(mine["rlrun"]["s_per_10k"])) / float(str(mine["sb3"]["s_per_10k"]))
            lines.append(f"Seed {seed}: rlrun / SB3 time per 10k env steps **{ratio:.2f}**; "
                         f"return {mine['rlrun']['final_return']} vs {mine['sb3']['final_return']}.")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        curve = json.loads(str(r["curve"]))
        ax.plot([c["env_steps"] for c in curve], [c["return"] for c in curve], label=f"{r['who']} seed {r['seed']}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy return (10 episodes)")
    ax.set_title(f"{args.algo.upper()} on HalfCheetah-v5")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=100)


if __name__ == "__main__":
    main()
