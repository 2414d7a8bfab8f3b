"""An external application: gymnasium CartPole run as if it were a foreign simulator, talking to a
``rollout=server`` run only through ``rlrun.client.PolicyClient``. It plays episodes until the run
says it has finished.

    python experiments/external_env/driver.py --address http://127.0.0.1:9900 --token-file server.token
    python experiments/external_env/driver.py ... --own-actions 0.3   # off-policy: choose 30% of actions itself
    python experiments/external_env/driver.py ... --inference local   # run the policy in this process

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

from rlrun.client import PolicyClient, RunFinished, ServerRestarted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--own-actions", type=float, default=0.0)
    ap.add_argument("--inference", choices=["remote", "local"], default="remote")
    ap.add_argument("--max-seconds", type=float, default=3600)
    args = ap.parse_args()
    client = PolicyClient(args.address, token_file=args.token_file, inference=args.inference)
    env = gym.make(args.env)
    rng = random.Random(args.seed)
    count = {"steps": 0, "episodes": 0, "restarts": 0}
    t0 = time.perf_counter()
    env.reset(seed=args.seed)
    try:
        while time.perf_counter() - t0 < args.max_seconds:
            try:
                play(client, env, args.own_actions, rng, count)
            except ServerRestarted:  # a resumed run: the episode in play is gone, start another
                count["restarts"] += 1
        finished = False
    except RunFinished:
        finished = True
    secs = time.perf_counter() - t0
    print(json.dumps({**count, "seconds": round(secs, 2), "steps_per_s": round(count["steps"] / max(secs, 1e-9), 1),
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
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=truncated)
            count["episodes"] += 1
            return


if __name__ == "__main__":
    main()
