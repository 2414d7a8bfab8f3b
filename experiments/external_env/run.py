"""Issue 16's study: learning and throughput of runs whose episodes external clients drive.

Every run is the real ``rlrun ... rollout=server`` (``tracking=none``) with client processes running
``driver.py`` (gymnasium CartPole-v1 behind ``rlrun.app.client.PolicyClient``).

- ``learn`` (per seed): ``+experiment=ppo_cartpole`` with 4 remote clients, the same with 4 local-
  inference clients, and ``+experiment=dqn_cartpole`` with 4 remote clients that choose half of their
  actions themselves (uniformly at random, ``log_action``); DQN stops on a greedy eval of 475 (10
  episodes every 20 iterations). Env steps and seconds to the target, per run.
- ``throughput``: 1, 4 and 16 clients playing one episode at a time (30k env steps a run), and 4
  clients playing 32 episodes side by side with one ``get_actions`` call a step (100k env steps
  remote, 400k local), x remote / local inference x learner (``ppo_cartpole``, or ``algo=pg``: one
  gradient step per 4096 rows, so the serving path is what is measured): aggregate env steps/s the
  clients achieved, over each client's whole life (``client_steps_per_s``) and from its first step
  on (``steady_steps_per_s``: without process start, torch import and first weights).
- ``ray``: the policy servers on 2 Ray workers (``rollout.num_workers=2``), 2 clients on each
  endpoint: PPO learning with remote clients (per seed), and 4 clients' throughput (one episode a
  client, 60k env steps) for remote / local inference x PPO / PG learners, and with 32 episodes a
  client (PG learner, 100k / 400k env steps).

- ``repeat``: the local-inference target's row (4 clients x 32 episodes, PG) 3 times: the median.

    python experiments/external_env/run.py [--seeds 0 1 2] [--parts learn throughput ray repeat]

Writes results/latest.md, results/<part>.csv, results/raw.json and results/latest.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import socket
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


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive TCP ports on 127.0.0.1 that nothing listens on right now."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            for p in range(port + 1, port + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


def session(work: Path, args: list[str], clients: int, driver_args: list[str], seed: int,
            timeout: float = 1800, endpoints: int = 1) -> dict[str, object]:
    """One run with ``clients`` driver processes; its summary and the clients' reports. With
    ``endpoints`` > 1 the policy servers are that many Ray workers, the clients spread over them."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_ports(endpoints)
    t0 = time.perf_counter()
    ray = [f"rollout.num_workers={endpoints}"] if endpoints > 1 else []
    run = subprocess.Popen([sys.executable, "-m", "rlrun", *args, "rollout=server", f"rollout.server.port={port}", *ray,
                            "tracking=none", f"seed={seed}", f"output_dir={work / 'run'}"], cwd=work, env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (work / "server.token").exists() and run.poll() is None:
        time.sleep(0.1)
    drivers = [subprocess.Popen([sys.executable, str(HERE / "driver.py"), "--address",
                                 f"http://127.0.0.1:{port + i % endpoints}",
                                 "--token-file", str(work / "server.token"), "--seed", str(100 * seed + i),
                                 *driver_args], cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for i in range(clients)]
    out, err = run.communicate(timeout=timeout)
    wall = time.perf_counter() - t0
    reports = []
    for d in drivers:
        o, e = d.communicate(timeout=120)
        reports.append(json.loads(o.strip().splitlines()[-1]) if o.strip() else {"error": e[-300:]})
    if run.returncode != 0:
        raise RuntimeError(f"rlrun failed ({run.returncode}): {err[-2000:]}")
    steps = re.search(r"env steps\s+([\d,]+) in ([\d.]+) s", out)
    final = re.search(r"return\s+final ([\d.]+)", out)
    evals = [float(m) for m in re.findall(r"eval at [\d,]+ steps: return ([\d.]+)", out)]
    return {"stopped": re.search(r"rlrun: stopped: (.*)", out)[1], "env_steps": int(steps[1].replace(",", "")),
            "train_s": float(steps[2]), "wall_s": round(wall, 1), "final_return": float(final[1]) if final else None,
            "last_eval": evals[-1] if evals else None,
            "clients_finished": sum(bool(r.get("run_finished")) for r in reports),
            "client_steps_per_s": round(sum(float(r.get("steps_per_s", 0)) for r in reports), 1),
            "steady_steps_per_s": round(sum(float(r.get("steady_steps_per_s", 0)) for r in reports), 1)}


LEARN = {  # name -> (rlrun args, driver args)
    "ppo_remote": (["+experiment=ppo_cartpole"], []),
    "ppo_local": (["+experiment=ppo_cartpole"], ["--inference", "local"]),
    "dqn_log_action": (["+experiment=dqn_cartpole", "stop.timesteps_total=150000", "evaluation.interval=20",
                        "evaluation.num_episodes=10",
                        "++stop={rollout/episode_return_mean: null, eval/episode_return_mean: 475}"],
                       ["--own-actions", "0.5"]),
}


def part_learn(root: Path, seeds: list[int]) -> list[dict[str, object]]:
    rows = []
    for seed in seeds:
        for name, (args, dargs) in LEARN.items():
            r = session(root / f"learn-{name}-{seed}", args, 4, dargs, seed)
            rows.append({"seed": seed, "run": name, **r})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def part_ray(root: Path, seeds: list[int]) -> list[dict[str, object]]:
    """Policy servers on 2 Ray workers, 2 clients on each: PPO learning with remote clients per seed,
    and one-episode-a-client throughput of each inference mode (PPO and PG learners)."""
    rows = []
    for seed in seeds:
        r = session(root / f"ray-learn-{seed}", ["+experiment=ppo_cartpole"], 4, [], seed, endpoints=2)
        rows.append({"what": "learn", "learner": "ppo", "inference": "remote", "seed": seed, **r})
        print(json.dumps(rows[-1]), flush=True)
    pg = ["algo=pg", "env=cartpole", "algo.train_batch_size=4096", "algo.lr=1e-3"]
    for learner, args in (("ppo", ["+experiment=ppo_cartpole"]), ("pg", pg)):
        for mode in ("remote", "local"):
            r = session(root / f"ray-tp-{learner}-{mode}",
                        [*args, "stop.timesteps_total=60000", "++stop={rollout/episode_return_mean: null}"],
                        4, ["--inference", mode], 0, endpoints=2)
            rows.append({"what": "throughput", "learner": learner, "inference": mode, "seed": 0, **r})
            print(json.dumps(rows[-1]), flush=True)
    for mode, steps in (("remote", 100_000), ("local", 400_000)):  # 32 episodes a client, as in ``throughput``
        r = session(root / f"ray-tp-pg-{mode}-32", [*pg, f"stop.timesteps_total={steps}",
                                                    "++stop={rollout/episode_return_mean: null}"],
                    4, ["--inference", mode, "--episodes", "32"], 0, endpoints=2)
        rows.append({"what": "throughput, 32 episodes a client", "learner": "pg", "inference": mode, "seed": 0, **r})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def part_repeat(root: Path, reps: int = 3) -> list[dict[str, object]]:
    """The local-inference target's row (4 clients x 32 episodes, PG learner, 400k env steps) ``reps``
    times in a row: on this shared machine one run can be 25% off (median in the report)."""
    rows = []
    pg = ["algo=pg", "env=cartpole", "algo.train_batch_size=4096", "algo.lr=1e-3"]
    for rep in range(reps):
        r = session(root / f"repeat-{rep}", [*pg, "stop.timesteps_total=400000",
                                             "++stop={rollout/episode_return_mean: null}"],
                    4, ["--inference", "local", "--episodes", "32"], rep)
        rows.append({"rep": rep, "learner": "pg", "inference": "local", "clients": 4, "episodes_each": 32, **r})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def part_throughput(root: Path) -> list[dict[str, object]]:
    rows = []
    pg = ["algo=pg", "env=cartpole", "algo.train_batch_size=4096", "algo.lr=1e-3"]
    plan = [(clients, 1, 30_000) for clients in (1, 4, 16)] + [(4, 32, 0)]  # (clients, episodes each, steps)
    for learner, args in (("ppo", ["+experiment=ppo_cartpole"]), ("pg", pg)):
        for mode in ("remote", "local"):
            for clients, episodes, steps in plan:
                steps = steps or (100_000 if mode == "remote" else 400_000)
                r = session(root / f"tp-{learner}-{mode}-{clients}-{episodes}",
                            [*args, f"stop.timesteps_total={steps}", "++stop={rollout/episode_return_mean: null}"],
                            clients, ["--inference", mode, "--episodes", str(episodes)], 0)
                rows.append({"learner": learner, "inference": mode, "clients": clients, "episodes_each": episodes,
                             **r})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def write_csv(rows: list[dict[str, object]], path: Path) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)


def table(rows: list[dict[str, object]]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def report(results: dict[str, list[dict[str, object]]]) -> None:
    lines = ["# External applications study: latest results", ""]
    for name, rows in results.items():
        write_csv(rows, RESULTS / f"{name}.csv")
        lines += [f"## {name}", "", table(rows), ""]
    for name in LEARN:
        rs = [r for r in results.get("learn", []) if r["run"] == name]
        if rs:
            lines.append(f"- {name}: median {statistics.median(float(r['env_steps']) for r in rs):.0f} env steps, "
                         f"{statistics.median(float(r['wall_s']) for r in rs):.1f} s whole process")
    if rs := results.get("repeat"):
        lines.append(f"- local inference, 4 clients x 32 episodes, PG, {len(rs)} runs: median "
                     f"{statistics.median(float(r['client_steps_per_s']) for r in rs):.0f} env steps/s over the "
                     f"clients' lives, {statistics.median(float(r['steady_steps_per_s']) for r in rs):.0f} from "
                     "their first step")
    (RESULTS / "latest.md").write_text("\n".join(lines) + "\n")
    plots(results)
    print((RESULTS / "latest.md").read_text())


def plots(results: dict[str, list[dict[str, object]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for learner, style in (("ppo", "-"), ("pg", "--")):
        for mode, color in (("remote", "tab:blue"), ("local", "tab:orange")):
            rs = [r for r in results.get("throughput", []) if r["learner"] == learner and r["inference"] == mode]
            one = [r for r in rs if r.get("episodes_each", 1) == 1]
            if one:
                ax.plot([r["clients"] for r in one], [r["client_steps_per_s"] for r in one], style, color=color,
                        marker="o", label=f"{mode} inference, learner {learner}")
            many = [r for r in rs if r.get("episodes_each", 1) > 1]
            if many:
                ax.plot([r["clients"] for r in many], [r["client_steps_per_s"] for r in many], "*", color=color,
                        markersize=12, markeredgecolor="k" if learner == "pg" else color,
                        label=f"{mode}, learner {learner}, 32 episodes a client (get_actions)")
    ax.set(xscale="log", yscale="log", xlabel="clients (processes)", ylabel="aggregate env steps/s",
           title="rollout=server throughput, CartPole-v1, 2 cores")
    ax.axhline(20_000, color="grey", lw=0.8, ls=":")
    ax.set_xticks([1, 4, 16], ["1", "4", "16"])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "latest.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parts", nargs="+", default=["learn", "throughput", "ray", "repeat"])
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rlrun-external-"))
    results: dict[str, list[dict[str, object]]] = {}
    try:
        if "learn" in args.parts:
            results["learn"] = part_learn(root, args.seeds)
        if "throughput" in args.parts:
            results["throughput"] = part_throughput(root)
        if "ray" in args.parts:
            results["ray"] = part_ray(root, args.seeds)
        if "repeat" in args.parts:
            results["repeat"] = part_repeat(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw = RESULTS / "raw.json"
    merged = {**(json.loads(raw.read_text()) if raw.exists() else {}), **results}
    raw.write_text(json.dumps(merged, indent=1))
    report(merged)


if __name__ == "__main__":
    main()
