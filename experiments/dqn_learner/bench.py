"""DQN learner updates per second: rlrun against Stable-Baselines3 on the same settings (issue 34:
rlrun's DQN updates/s >= 2x SB3's). One update = one minibatch of 128 replayed CartPole rows through
the online net (with gradients), the target net (and, with double Q, the online net again) on the next
observations, the TD loss, backward, gradient clipping (norm 10) and one Adam step, on a 4-256-256-2 MLP
(the width of ``dqn_cartpole``).

Settings measured:
- ``sb3``: SB3 2.9.2's DQN (no double Q, no dueling, 1-step targets, Huber loss, max_grad_norm 10).
- ``rlrun (SB3's settings)``: rlrun's DQN with the same: double_q false, dueling false, n_step 1.
- ``rlrun (dqn_cartpole)``: the preset's learner: double Q and dueling heads (3-step targets cost
  nothing in the update).
- ``..., autograd``: the same with ``hand_gradient=False``: torch's autograd instead of the gradient
  derived by hand for the built-in q_mlp (rlrun/models/q_mlp_grad.py).
- ``..., denormals kept``: without ``flush_denormals()`` (which every rlrun run calls first): the
  learner as it was before 2026-11-28. SB3 keeps denormals (torch's default).
- ``rlrun (rainbow_cartpole)``: that preset's learner: C51 (51 atoms), noisy dueling heads, double Q,
  prioritized replay (each minibatch drawn after the last one's priority update); its
  gradient by hand (rlrun/models/c51_grad.py) or, ``autograd``, by torch. SB3 has no Rainbow to compare.

Each figure is one process timing 2,048 updates after 256 of warm-up: rlrun's learn hook as a run
calls it for ``dqn_cartpole`` (256 env steps stored, then 64 updates, their targets' forward pass in
one go), on a buffer of 10k rows; SB3's ``train`` after 1,200 env steps of its own collection;
--repeats processes per setting and thread count, interleaved; the median is reported.
Writes results/<name>.md, .csv and .png.

    python experiments/dqn_learner/bench.py --repeats 5 --name dqn_learner_2026-11-27
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
UPDATES = 2048

RLRUN = """
import time, numpy as np, torch, gymnasium as gym
from rlrun.app.torch_compute import flush_denormals
if {flush}:
    flush_denormals()  # as every run does before its threads start
torch.set_num_threads({threads})
from rlrun.algos.algorithm import LearnContext, get_algorithm, make_policy
from rlrun.core.registry import MODELS
from rlrun.data.batch import SampleBatch as SB
from rlrun.sources.plugins import load_builtins
load_builtins()
m_cfg = MODELS.entry("q_mlp").config_cls(hiddens=[256, 256], dueling={dueling}, num_atoms={atoms}, v_min=0.0,
                                         v_max=500.0, noisy={rainbow})
a_cfg = get_algorithm("dqn").config_cls(learning_starts=0, sgd_minibatch_size=128, training_intensity=32.0,
                                        double_q={double_q}, n_step=1, lr=1e-3, grad_clip=10.0, hand_gradient={hand},
                                        target_network_update_freq=10**9, prioritized_replay={rainbow})
p = make_policy("dqn", gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(2),
                model_config=m_cfg, algo_config=a_cfg)
rng, n = np.random.default_rng(0), 10_000
rows = SB({{SB.OBS: rng.standard_normal((n, 4)).astype(np.float32), SB.ACTIONS: rng.integers(0, 2, n),
           SB.NSTEP_NEXT_OBS: rng.standard_normal((n, 4)).astype(np.float32),
           SB.NSTEP_REWARDS: np.ones(n, np.float32), SB.NSTEP_DISCOUNT: np.full(n, 0.99, np.float32)}})
learn = get_algorithm("dqn").learn
p.state.replay.add(rows)  # 10k rows in the buffer
batch = rows.slice(slice(0, 256))  # as dqn_cartpole: 256 env steps a call, 64 updates of 128 rows
for i in range(4):
    learn(p, batch, LearnContext(n, i))  # 256 updates of warm-up
calls, steps = {updates} // 64, 0
t = time.perf_counter()
for i in range(calls):
    steps += learn(p, batch, LearnContext(n, 4 + i))["train/num_sgd_steps"]
print(steps / (time.perf_counter() - t))
"""
SB3 = """
import time, torch
torch.set_num_threads({threads})
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env
env = make_vec_env("CartPole-v1", n_envs=1, seed=0)
model = DQN("MlpPolicy", env, learning_rate=1e-3, batch_size=128, learning_starts=1000, gradient_steps=1,
            train_freq=1, policy_kwargs=dict(net_arch=[256, 256]), seed=0, device="cpu", verbose=0)
model.learn(total_timesteps=1_200)  # past learning_starts: fills the buffer, 200 updates of warm-up
t = time.perf_counter(); model.train(gradient_steps={updates}, batch_size=128); dt = time.perf_counter() - t
print({updates} / dt)
"""
SETTINGS = {
    "sb3": None,
    "rlrun (SB3's settings)": {"dueling": False, "double_q": False, "hand": True, "flush": True},
    "rlrun (SB3's settings, autograd)": {"dueling": False, "double_q": False, "hand": False, "flush": True},
    "rlrun (dqn_cartpole)": {"dueling": True, "double_q": True, "hand": True, "flush": True},
    "rlrun (dqn_cartpole, autograd)": {"dueling": True, "double_q": True, "hand": False, "flush": True},
    "rlrun (dqn_cartpole, autograd, denormals kept)": {"dueling": True, "double_q": True, "hand": False,
                                                       "flush": False},
    "rlrun (rainbow_cartpole)": {"dueling": True, "double_q": True, "hand": True, "flush": True, "rainbow": True},
    "rlrun (rainbow_cartpole, autograd)": {"dueling": True, "double_q": True, "hand": False, "flush": True,
                                           "rainbow": True},
}


def options(s: dict[str, bool]) -> dict[str, object]:
    """A setting's values for the RLRUN template (no Rainbow parts unless it says so)."""
    rainbow = s.get("rainbow", False)
    return {**s, "rainbow": rainbow, "atoms": 51 if rainbow else 1}


def updates_per_s(who: str, threads: int) -> float:
    s = SETTINGS[who]
    code = SB3.format(threads=threads, updates=UPDATES) if s is None else \
        RLRUN.format(threads=threads, updates=UPDATES, **options(s))
    with tempfile.TemporaryDirectory(prefix="rlrun-dqnl-") as d:
        p = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True,
                           env={**ENV, "TMPDIR": d}, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"{who} failed:\n{p.stderr[-2000:]}")
    return float(p.stdout.strip().splitlines()[-1])


def plot(rows: list[dict[str, object]], settings: list[str], path: Path) -> None:
    """Median updates/s per setting, one group of bars per thread count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted({int(str(r["threads"])) for r in rows})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for k, who in enumerate(settings):
        med = [statistics.median(float(str(r["updates_per_s"])) for r in rows
                                 if r["who"] == who and int(str(r["threads"])) == t) for t in threads]
        ax.bar([t * (len(settings) + 1) + k for t in range(len(threads))], med, label=who)
    width = len(settings) + 1
    ax.set_xticks([t * width + (width - 2) / 2 for t in range(len(threads))], [f"{t} torch thread(s)" for t in threads])
    ax.set_ylabel("learner updates/s (median)")
    ax.set_title("DQN, 128-row minibatches, 4-256-256-2 MLP")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--name", default="latest")
    ap.add_argument("--only", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="SETTING",
                    help="measure these settings only (sb3 is always measured: the ratios are to it)")
    args = ap.parse_args()
    settings = ["sb3", *(w for w in args.only if w != "sb3")]
    rows = []
    for threads in args.threads:
        for rep in range(args.repeats):
            for who in settings:  # interleaved: the machine's drift reaches every setting alike
                rows.append({"who": who, "threads": threads, "repeat": rep,
                             "updates_per_s": round(updates_per_s(who, threads), 1)})
                print(rows[-1], flush=True)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    only = "" if args.only == list(SETTINGS) else " --only " + " ".join(f'"{w}"' for w in args.only)
    lines = [f"# DQN learner updates per second, {time.strftime('%Y-%m-%d')}", "",
             f"`python experiments/dqn_learner/bench.py --repeats {args.repeats} --threads "
             f"{' '.join(map(str, args.threads))}{only}` (128-row minibatches, 4-256-256-2 MLP; median of "
             f"{args.repeats} processes of {UPDATES:,} updates each).", "",
             "| setting | torch threads | updates/s, median | runs | / SB3 | / SB3, same repeat (median) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for threads in args.threads:
        med = {who: statistics.median(r["updates_per_s"] for r in rows if r["who"] == who and r["threads"] == threads)
               for who in settings}
        for who in settings:
            runs = " / ".join(f"{r['updates_per_s']:.0f}" for r in rows if r["who"] == who and r["threads"] == threads)
            sb3 = {r["repeat"]: r["updates_per_s"] for r in rows if r["who"] == "sb3" and r["threads"] == threads}
            paired = statistics.median(r["updates_per_s"] / sb3[r["repeat"]] for r in rows
                                       if r["who"] == who and r["threads"] == threads)
            ratio = med[who] / med["sb3"]
            lines.append(f"| {who} | {threads} | {med[who]:.0f} | {runs} | {ratio:.2f} | {paired:.2f} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    plot(rows, settings, out / f"{args.name}.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
