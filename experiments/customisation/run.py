"""Issue 14's presets over seeds, and sb3-contrib's RecurrentPPO beside the LSTM preset.

Cases (each a whole process, the real CLI with ``tracking=none`` in a fresh launch directory):

- ``lstm``: ``+experiment=ppo_lstm_stateless_cartpole`` (target 475 within 200k env steps);
- ``mlp``: the same preset with the LSTM replaced by the plain MLP (the proof that memory is used);
- ``sb3``: sb3-contrib RecurrentPPO with rl-zoo's CartPoleNoVel-v1 hyperparameters (ppo_lstm.yml:
  8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, lambda 0.8, lr lin_0.001, clip lin_0.2,
  ortho_init False, ReLU, LSTM 64 with a critic LSTM, net_arch pi=[64] vf=[64], VecNormalize) on
  CartPole-v1 with the velocities removed, its 100k-step budget; time and env steps until its
  100-episode mean return first reaches 475, and the whole-process wall time;
- ``minigrid``: ``+experiment=ppo_minigrid_empty`` (target 0.85 within 200k env steps);
- ``pendulum`` / ``pendulum_filter``: ``+experiment=ppo_pendulum`` without / with
  ``rollout.observation_filter=mean_std``.

Cases run interleaved (seed by seed), two processes at a time. Writes results/latest.md, .csv, .png.
sb3-contrib is this study's own dependency: ``pip install sb3-contrib`` (not one of rlrun's).

    python experiments/customisation/run.py [--seeds 0 1 2] [--cases lstm mlp sb3 ...] [--jobs 2]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MLP = ["model=mlp", "~model.post_hiddens", "~model.max_seq_len", "model.hiddens=[64,64]"]  # the LSTM keys removed
CASES = {  # case -> (preset, overrides, target)
    "lstm": ("ppo_lstm_stateless_cartpole", [], "475 within 200k env steps"),
    "mlp": ("ppo_lstm_stateless_cartpole", MLP, "far below the LSTM"),
    "sb3": (None, [], "500 within its 100k budget (rl-zoo)"),
    "minigrid": ("ppo_minigrid_empty", [], "0.85 within 200k env steps"),
    "pendulum": ("ppo_pendulum", [], "-250 within 500k env steps"),
    "pendulum_filter": ("ppo_pendulum", ["rollout.observation_filter=mean_std"], "-250 within 500k env steps"),
}

SB3 = r'''
import sys, time, numpy as np, gymnasium as gym, torch
from torch import nn
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

seed = int(sys.argv[1])
torch.set_num_threads(1)

class NoVel(gym.ObservationWrapper):  # rl-zoo's CartPoleNoVel-v1: position and angle only
    def __init__(self, env):
        super().__init__(env)
        high = np.array([4.8, 0.42], np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
    def observation(self, o):
        return o[[0, 2]].astype(np.float32)

class Target(BaseCallback):  # env steps and seconds until the 100-episode mean return reaches 475
    def __init__(self, t0):
        super().__init__()
        self.t0, self.returns, self.hit = t0, [], None
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
        if self.hit is None and len(self.returns) >= 100 and np.mean(self.returns[-100:]) >= 475:
            self.hit = (self.num_timesteps, time.perf_counter() - self.t0)
        return True

t0 = time.perf_counter()
env = VecNormalize(make_vec_env("CartPole-v1", n_envs=8, seed=seed, wrapper_class=NoVel))
lin = lambda v: (lambda progress: progress * v)
model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                     ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, device="cpu",
                     policy_kwargs=dict(ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64,
                                        enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])))
cb = Target(t0)
model.learn(100_000, callback=cb)
final = float(np.mean(cb.returns[-100:]))
print(f"RESULT steps_to_475={cb.hit[0] if cb.hit else 'none'} s_to_475={cb.hit[1] if cb.hit else 'none'} "
      f"final={final:.1f}")
'''


def _run(argv: list[str], cwd: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                             float]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=7200,
                       env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    return p, time.perf_counter() - t0


def one_run(case: str, seed: int) -> dict[str, object]:
    preset, extra, _ = CASES[case]
    with tempfile.TemporaryDirectory(prefix="rlrun-custom-") as d:
        if preset is None:
            p, wall = _run([sys.executable, "-c", SB3, str(seed)], d, {"SB3_LOGDIR": d})  # not a dir in /tmp
            if p.returncode != 0:
                return {"case": case, "seed": seed, "status": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
            m = re.search(r"RESULT steps_to_475=(\S+) s_to_475=(\S+) final=(\S+)", p.stdout)
            hit = m[1] != "none"
            return {"case": case, "seed": seed, "status": "target met" if hit else "budget used",
                    "env_steps": int(m[1]) if hit else 100_000, "wall_s": round(wall, 1),
                    "s_to_target": round(float(m[2]), 1) if hit else "", "final_return": float(m[3])}
        p, wall = _run([sys.executable, "-m", "rlrun", f"+experiment={preset}", f"seed={seed}", "tracking=none",
                        *extra], d)
    if p.returncode != 0:
        return {"case": case, "seed": seed, "status": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    stopped = re.search(r"^rlrun: stopped: (.*)$", p.stdout, re.M)[1]
    steps = int(re.search(r"env steps\s+([\d,]+)", p.stdout)[1].replace(",", ""))
    final = float(re.search(r"return\s+final ([-\d.]+)", p.stdout)[1])
    met = "(target met)" in stopped
    return {"case": case, "seed": seed, "status": "target met" if met else stopped, "env_steps": steps,
            "wall_s": round(wall, 1), "s_to_target": round(wall, 1) if met else "", "final_return": final}


def write(rows: list[dict[str, object]], out: Path) -> None:
    out.mkdir(exist_ok=True)
    keys = ["case", "seed", "status", "env_steps", "wall_s", "s_to_target", "final_return"]
    with open(out / "latest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in keys} for r in rows)
    lines = ["| case | target | seeds at target | env steps (median) | wall s (median) | final return per seed |",
             "| --- | --- | --- | --- | --- | --- |"]
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        met = sum(r["status"] == "target met" for r in rs)
        steps = [r["env_steps"] for r in rs if "env_steps" in r]
        walls = [r["wall_s"] for r in rs if "wall_s" in r]
        finals = " / ".join(f"{r.get('final_return', 'failed')}" for r in rs)
        med_steps = f"{statistics.median(steps):,.0f}" if steps else "-"
        med_wall = f"{statistics.median(walls):.1f}" if walls else "-"
        lines.append(f"| {case} | {CASES[str(case)][2]} | {met}/{len(rs)} | {med_steps} | {med_wall} | {finals} |")
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, out / "latest.png")


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for i, case in enumerate(cases):
        rs = [r for r in rows if r["case"] == case and "wall_s" in r]
        ax[0].scatter([i] * len(rs), [r["wall_s"] for r in rs])
        ax[1].scatter([i] * len(rs), [r["env_steps"] for r in rs])
    for a, title in zip(ax, ("whole-process wall time (s)", "env steps (to target, or the budget)"), strict=True):
        a.set_xticks(range(len(cases)), cases, rotation=30)
        a.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--update", action="store_true", help="keep results/latest.csv's rows of the other cases")
    args = ap.parse_args()
    jobs = [(c, s) for s in args.seeds for c in args.cases]  # interleaved: seed by seed
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda job: one_run(*job), jobs))
    for r in rows:
        print(r)
    if args.update and (HERE / "results" / "latest.csv").exists():
        with open(HERE / "results" / "latest.csv") as f:
            kept = [{k: _num(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)
                    if r["case"] not in args.cases]
        rows = sorted(kept + rows, key=lambda r: (list(CASES).index(str(r["case"])), int(r["seed"])))
    write(rows, HERE / "results")


def _num(v: str) -> object:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


if __name__ == "__main__":
    main()
