"""The reference for ``ppo_lstm_stateless_cartpole``'s target: sb3-contrib's RecurrentPPO with rl-zoo3's
hyperparameters for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml: 8 envs x 32 steps, minibatch 256, 20
epochs, lr 1e-3 and clip 0.2 both decayed linearly to 0 over --steps (rl-zoo: over its 100k), gamma
0.98, GAE lambda 0.8, VecNormalize of observations and rewards, separate actor and critic LSTMs of 64
units, ReLU heads of 64). CartPole-v1 with the velocities removed, as rlrun's preset
(``mask_observation`` keeping entries 0 and 2).

Measured per seed: the env steps at which the mean training return of the last 100 episodes (the
env's own returns, before normalisation) first reaches 475 within --steps, or the best such mean.
One line of JSON per seed on stdout, and results/<name>.md when --name is given.

    python experiments/regression/lstm_reference.py --seeds 0 1 2 3 4 --name lstm_reference_2026-11-27
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

HERE = Path(__file__).resolve().parent
TARGET = 475.0


def no_velocity(env: gym.Env) -> gym.Env:
    space = gym.spaces.Box(env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]], dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda o: o[[0, 2]], space)


class FirstAtTarget(BaseCallback):
    """Stops at the first step where the last 100 episodes' mean return is >= TARGET."""

    def __init__(self) -> None:
        super().__init__()
        self.best, self.met_at = -np.inf, None

    def _on_step(self) -> bool:
        buf = self.model.ep_info_buffer
        if len(buf) == 100:
            mean = float(np.mean([e["r"] for e in buf]))
            self.best = max(self.best, mean)
            if mean >= TARGET:
                self.met_at = self.num_timesteps
                return False
        return True


def linear(start: float):  # rl-zoo's lin_<start>: start x the fraction of the run remaining
    return lambda remaining: remaining * start


def run(seed: int, steps: int) -> dict[str, object]:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=8, seed=seed, wrapper_class=no_velocity), gamma=0.98)
    model = RecurrentPPO(
        "MlpLstmPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
        learning_rate=linear(1e-3), clip_range=linear(0.2), ent_coef=0.0, seed=seed, device="cpu",
        policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                           enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])),
    )
    cb = FirstAtTarget()
    model.learn(steps, callback=cb)
    return {"seed": seed, "met_at": cb.met_at, "best_100_mean": round(cb.best, 1),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--name")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        rows.append(run(seed, args.steps))
        print(json.dumps(rows[-1]), flush=True)
    if args.name:
        lines = [f"# RecurrentPPO (sb3-contrib, rl-zoo3's CartPoleNoVel-v1 settings), {time.strftime('%Y-%m-%d')}", "",
                 f"`python experiments/regression/lstm_reference.py --seeds {' '.join(map(str, args.seeds))} "
                 f"--steps {args.steps}` (one torch thread). Env steps at which the last 100 training episodes' "
                 f"mean return first reached {TARGET:.0f}, else the best such mean.", "",
                 "| seed | env steps at 475 | best 100-episode mean | wall s |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['seed']} | {r['met_at'] or 'miss'} | {r['best_100_mean']} | {r['wall_s']} |" for r in rows]
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
