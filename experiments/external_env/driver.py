"""An external application: gymnasium CartPole run as if it were a foreign simulator, talking to a
``rollout=server`` run only through ``rlrun.app.client.PolicyClient``. It plays episodes until the run
says it has finished.

    python experiments/external_env/driver.py --address http://127.0.0.1:9900 --token-file server.token
    python experiments/external_env/driver.py ... --own-actions 0.3   # off-policy: choose 30% of actions itself
    python experiments/external_env/driver.py ... --inference local   # run the policy in this process
    python experiments/external_env/driver.py ... --inference local --episodes 32   # 32 at once, batched

With ``--episodes N`` it plays N episodes side by side (N copies of the env) and asks for their
actions with one ``get_actions`` call per step: with local inference, one forward pass for all N.

With ``--own-actions EPS`` the driver picks a uniformly random action with probability EPS and
reports it with ``log_action``; the other steps ask the server with ``get_action``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import gymnasium as gym
import numpy as np

from rlrun.app.client import PolicyClient, RunFinished, ServerRestarted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--own-actions", type=float, default=0.0)
    ap.add_argument("--inference", choices=["remote", "local"], default="remote")
    ap.add_argument("--episodes", type=int, default=1, help="episodes played side by side")
    ap.add_argument("--max-seconds", type=float, default=3600)
    args = ap.parse_args()
    if args.episodes > 1 and args.own_actions:
        ap.error("--own-actions drives one episode at a time (--episodes 1)")
    client = PolicyClient(args.address, token_file=args.token_file, inference=args.inference)
    envs = [gym.make(args.env) for _ in range(args.episodes)]
    rng = random.Random(args.seed)
    count: dict = {"steps": 0, "episodes": 0, "restarts": 0}
    t0 = time.perf_counter()
    for i, env in enumerate(envs):
        env.reset(seed=args.seed * 1000 + i)
    try:
        while time.perf_counter() - t0 < args.max_seconds:
            try:
                if len(envs) > 1:
                    play_side_by_side(client, envs, count)
                else:
                    play(client, envs[0], args.own_actions, rng, count)
            except ServerRestarted:  # a resumed run: the episode in play is gone, start another
                count["restarts"] += 1
        finished = False
    except RunFinished:
        finished = True
    secs = time.perf_counter() - t0
    # steady state: from the first step on (the process start, the connection and, in local mode, the
    # torch import and the first weights are behind it)
    steady = (count["steps"] - count["first_steps"]) / max(time.perf_counter() - count["first_t"], 1e-9) \
        if "first_t" in count else 0.0
    count.pop("first_t", None)
    count.pop("first_steps", None)
    print(json.dumps({**count, "seconds": round(secs, 2), "steps_per_s": round(count["steps"] / max(secs, 1e-9), 1),
                      "steady_steps_per_s": round(steady, 1),
                      "run_finished": finished, "torch_imported": "torch" in sys.modules}))
    sys.exit(0 if finished else 1)


def play(client: PolicyClient, env: gym.Env, own_actions: float, rng: random.Random, count: dict[str, int]) -> None:
    """One episode, driven through the client."""
    obs, _ = env.reset()
    eid = client.start_episode()
    while True:
        if own_actions and rng.random() < own_actions:
            action = env.action_space.sample()
            client.log_action(eid, obs, action)
        else:
            action = client.get_action(eid, obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        client.log_returns(eid, reward)
        count["steps"] += 1
        _first(count, 1)
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=truncated)
            count["episodes"] += 1
            return


def _first(count: dict, steps: int) -> None:
    """Note when the first step was taken (the steady-state rate counts from there)."""
    if "first_t" not in count:
        count["first_t"], count["first_steps"] = time.perf_counter(), steps


def play_side_by_side(client: PolicyClient, envs: list[gym.Env], count: dict[str, int]) -> None:
    """Episodes in every env at once, one batched ``get_actions`` a step; an env whose episode ends
    starts the next one. Returns only through an exception (the run finished or restarted)."""
    obs = [env.reset()[0] for env in envs]
    eids = [client.start_episode() for _ in envs]
    while True:
        actions = client.get_actions(eids, np.stack(obs))
        _first(count, len(envs))
        for i, env in enumerate(envs):
            obs[i], reward, terminated, truncated, _ = env.step(actions[i])
            client.log_returns(eids[i], reward)
            count["steps"] += 1
            if terminated or truncated:
                client.end_episode(eids[i], obs[i], truncated=truncated)
                count["episodes"] += 1
                obs[i], _ = env.reset()
                eids[i] = client.start_episode()


if __name__ == "__main__":
    main()
