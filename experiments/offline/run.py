"""Issue 15's offline study: record -> train from files -> evaluate on the env, per seed.

Everything runs through the real CLIs (``rlrun``, ``rlrun-eval``) with ``tracking=none``, except the
off-policy estimates and the reader's memory, which use rlrun's Python API. Per seed:

- ``record``: ``+experiment=ppo_cartpole output=dqn/ppo_training`` (everything PPO sampled while it
  learned) with a checkpoint every 5 iterations, then rlrun-eval ``explore=true output=``
  recordings: ``expert`` (final checkpoint, 100 episodes); ``mixed`` (20 episodes of the final
  checkpoint + 500 of iteration 5's, return ~40); ``dqn/random`` (500 episodes of a 1-iteration
  run's nearly uniform policy); ``ope`` (100 episodes of each checkpoint in the pairs below).
- ``bc``: ``+experiment=bc_cartpole input=expert``: greedy eval return (target 475).
- ``marwil``: BC and MARWIL (beta 1) on ``mixed``, 300k rows each: greedy eval returns.
- ``dqn``: ``+experiment=dqn_cartpole input=dqn`` (PPO's training replay + random episodes): greedy eval.
- ``ope``: IS, WIS, DM, DR and WDR against the target's true discounted return (gamma 0.99, 100
  on-policy episodes), for two families of behaviour/target pairs: ``checkpoints`` (100 episodes of
  one PPO checkpoint's data, another's policy) and ``mixture`` (500 episodes of the target mixed
  with the uniform policy, eps 0.1 and 0.3, recorded with ``EpisodeWriter``).
Once: ``memory`` (RSS while reading a 1M-row dataset 5 times through the shuffle buffer) and
``write`` (sampling throughput with and without ``output=``, interleaved).

    python experiments/offline/run.py [--seeds 0 1 2] [--parts record bc marwil dqn ope memory write]

Writes results/latest.md, results/*.csv and results/*.png. Work files go to a temporary directory
(``--work DIR`` keeps them).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / "results"
GAMMA = 0.99
MIXED_BUDGET = 300_000  # rows each of BC and MARWIL train on in the mixed-data comparison
OPE_PAIRS = [("iter_000060", "final"), ("final", "iter_000060"), ("iter_000040", "iter_000060"),
             ("iter_000060", "iter_000040")]  # (behaviour, target)
# behaviour = (1 - eps) target + eps uniform: data that covers every action the target takes
OPE_MIX_TARGETS = ["iter_000040", "iter_000060", "final"]
OPE_MIX_EPS = [0.1, 0.3]
OPE_METHODS = ("is", "wis", "dm", "dr", "wdr")
# behaviour episodes per mixture dataset: with 100, plain DR missed 15% on 2 of 18 pairs (the
# variance of the ratio products at eps 0.3 over 500-step episodes); its error shrinks as 1/sqrt(n)
OPE_MIX_EPISODES = 500


def sh(argv: list[str], cwd: Path, timeout: float = 3600) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout, time.perf_counter() - t0


def rlrun(*args: str, cwd: Path) -> tuple[str, float]:
    return sh([sys.executable, "-m", "rlrun", *args, "tracking=none"], cwd)


def record(ckpt: Path, episodes: int, out: Path, cwd: Path) -> None:
    sh([sys.executable, "-m", "rlrun.app.eval_cli", f"checkpoint={ckpt}", f"episodes={episodes}", "explore=true",
        f"output={out}", "log=false", f"out={cwd / 'eval' / out.name}"], cwd)


def checkpoint(work: Path, name: str) -> Path:
    ckpts = sorted((work / "ppo" / "checkpoints").iterdir())
    return ckpts[-1] if name == "final" else work / "ppo" / "checkpoints" / name


def part_record(work: Path, seed: int) -> None:
    rlrun("+experiment=ppo_cartpole", f"seed={seed}", f"output_dir={work / 'ppo'}", "checkpoint.every_n_iters=5",
          "checkpoint.keep_last=1000", "progress=false", f"output={work / 'dqn' / 'ppo_training'}", cwd=work)
    rlrun("+experiment=ppo_cartpole", f"seed={seed}", f"output_dir={work / 'random'}", "stop.training_iteration=1",
          "progress=false", cwd=work)
    final = checkpoint(work, "final")
    record(final, 100, work / "expert", work)
    record(final, 20, work / "mixed" / "expert", work)
    record(checkpoint(work, "iter_000005"), 500, work / "mixed" / "poor", work)
    record(sorted((work / "random" / "checkpoints").iterdir())[-1], 500, work / "dqn" / "random", work)
    for name in {n for pair in OPE_PAIRS for n in pair}:
        record(checkpoint(work, name), 100, work / "ope" / name, work)


def rows(path: Path) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(path, format="parquet").count_rows()


def evals(stdout: str) -> list[float]:
    return [float(m) for m in re.findall(r"eval at [\d,]+ (?:steps|rows): return ([\d.]+)", stdout)]


def part_bc(work: Path, seed: int) -> dict[str, object]:
    out, secs = rlrun("+experiment=bc_cartpole", f"input={work / 'expert'}", f"seed={seed}",
                      f"output_dir={work / 'bc'}", cwd=work)
    stopped = re.search(r"rlrun: stopped: (.*)", out)
    steps = re.search(r"env steps\s+([\d,]+)", out)
    return {"seed": seed, "rows_recorded": rows(work / "expert"), "greedy_eval": evals(out)[-1],
            "rows_read": int(steps[1].replace(",", "")) if steps else None, "seconds": round(secs, 1),
            "stopped": stopped[1] if stopped else ""}


def part_marwil(work: Path, seed: int) -> list[dict[str, object]]:
    out = []
    for algo in ("bc", "marwil"):
        stdout, secs = rlrun("+experiment=bc_cartpole", f"algo={algo}", f"input={work / 'mixed'}", f"seed={seed}",
                             f"stop.timesteps_total={MIXED_BUDGET}", "++stop={eval/episode_return_mean: null}",
                             f"output_dir={work / ('mixed_' + algo)}", cwd=work)
        e = evals(stdout)
        out.append({"seed": seed, "algo": algo, "rows": rows(work / "mixed"), "final_eval": e[-1],
                    "last5_mean": round(statistics.mean(e[-5:]), 1), "best_eval": max(e), "seconds": round(secs, 1),
                    "curve": json.dumps(e)})
    return out


def part_dqn(work: Path, seed: int) -> dict[str, object]:
    stdout, secs = rlrun("+experiment=dqn_cartpole", f"input={work / 'dqn'}", f"seed={seed}",
                         "stop.timesteps_total=300000", "evaluation.interval=20", "evaluation.num_episodes=10",
                         "++stop={rollout/episode_return_mean: null, eval/episode_return_mean: 475}",
                         f"output_dir={work / 'dqn_run'}", cwd=work)
    e = evals(stdout)
    return {"seed": seed, "rows": rows(work / "dqn"), "final_eval": e[-1], "best_eval": max(e),
            "evals": len(e), "seconds": round(secs, 1), "curve": json.dumps(e)}


def part_ope(work: Path, seed: int) -> list[dict[str, object]]:
    code = f"""
import json, sys
from pathlib import Path
import gymnasium as gym
import numpy as np
import torch
from rlrun.sources.plugins import load_builtins
load_builtins()
from rlrun.app.cli import compose
from rlrun.training.export import load_policy
from rlrun.data.episodes import EpisodeWriter
from rlrun.training.ope import OffPolicyEvaluator, action_probs, load_episodes
torch.set_num_threads(1)
work = Path({str(work)!r})
methods = {list(OPE_METHODS)!r}

def policy(name):
    ckpts = sorted((work / "ppo" / "checkpoints").iterdir())
    return load_policy(ckpts[-1] if name == "final" else work / "ppo" / "checkpoints" / name)

def true_value(name, lp):
    return float(np.mean([np.sum(e["rewards"] * {GAMMA} ** np.arange(len(e)))
                          for e in load_episodes(str(work / "ope" / name), 100, lp.action_space)]))

def estimate(data, lp, episodes):
    cfg = compose(["+experiment=bc_cartpole", f"input={{data}}", "tracking=none",
                   "offline.evaluation=[" + ",".join(methods) + "]", f"offline.evaluation_episodes={{episodes}}"])
    return OffPolicyEvaluator(cfg, lp.action_space).evaluate(lp.policy)

def record_mixture(lp, eps, out):
    # behaviour mu = (1 - eps) pi + eps uniform, saved through rlrun's EpisodeWriter with mu(a|s)
    env, rng = gym.make("CartPole-v1"), np.random.default_rng({seed})
    with EpisodeWriter(out, env.observation_space, env.action_space, env_id="CartPole-v1") as w:
        for e in range({OPE_MIX_EPISODES}):
            obs, _ = env.reset(seed={seed} * 1000 + e)
            done = False
            while not done:
                mu = (1 - eps) * action_probs(lp.policy, obs[None])[0] + eps / env.action_space.n
                a = int(rng.choice(len(mu), p=mu / mu.sum()))
                nxt, r, term, trunc, _ = env.step(a)
                w.add_step(obs, a, r, term, trunc, nxt, action_prob=float(mu[a]))
                obs, done = nxt, term or trunc

out = []
for behaviour, target in {OPE_PAIRS!r}:
    lp = policy(target)
    m = estimate(work / "ope" / behaviour, lp, 100)
    out.append({{"family": "checkpoints", "behaviour": behaviour, "target": target, "true": true_value(target, lp),
                "behaviour_value": m["ope/is/v_behavior"], **{{k: m[f"ope/{{k}}/v_target"] for k in methods}}}})
for target in {OPE_MIX_TARGETS!r}:
    lp = policy(target)
    for eps in {OPE_MIX_EPS!r}:
        data = work / "ope_mix" / f"{{target}}_eps{{eps}}_n{OPE_MIX_EPISODES}"
        if not data.exists():
            record_mixture(lp, eps, data)
        m = estimate(data, lp, {OPE_MIX_EPISODES})
        out.append({{"family": "mixture", "behaviour": f"{{eps}} uniform + {{1 - eps:.1f}} target", "target": target,
                    "true": true_value(target, lp), "behaviour_value": m["ope/is/v_behavior"],
                    **{{k: m[f"ope/{{k}}/v_target"] for k in methods}}}})
print(json.dumps(out))
"""
    stdout, _ = sh([sys.executable, "-c", code], work)
    result = json.loads(stdout.strip().splitlines()[-1])
    for r in result:
        r["seed"] = seed
        for k in OPE_METHODS:
            r[f"{k}_err_pct"] = round(100 * abs(r[k] - r["true"]) / abs(r["true"]), 1)
    return result


MEMORY = r"""
import json, sys, time, resource
import psutil
from rlrun.sources.plugins import load_builtins
load_builtins()
from rlrun.app.cli import compose
from rlrun.training.export import load_policy
from rlrun.config.offline import input_files
from rlrun.data.reader import ParquetReader
src, ckpt = sys.argv[1], sys.argv[2]
lp = load_policy(ckpt)
files = input_files(src)
reader = ParquetReader(files, lp.policy, lp.obs_space, lp.action_space, shuffle_buffer=10000)
proc = psutil.Process()
trace = []
t0 = time.perf_counter()
while reader.passes < 5:
    reader.next_batch(2048)
    trace.append((reader.rows_read, proc.memory_info().rss / 2**20))
print(json.dumps({"trace": trace[::10], "seconds": time.perf_counter() - t0, "rows_read": reader.rows_read}))
"""


def part_memory(work: Path) -> dict[str, object]:
    ckpt = checkpoint(work, "final")
    data = work / "million"
    record(ckpt, 2000, data, work)
    stdout, _ = sh([sys.executable, "-c", MEMORY, str(data), str(ckpt)], work)
    r = json.loads(stdout.strip().splitlines()[-1])
    rss = [m for _, m in r["trace"]]
    n = len(rss)
    return {"dataset_rows": rows(data), "rows_read": r["rows_read"], "seconds": round(r["seconds"], 1),
            "rss_mb_after_pass_1": round(rss[n // 5], 1), "rss_mb_end": round(rss[-1], 1),
            "rss_mb_max": round(max(rss), 1), "trace": json.dumps(r["trace"])}


WRITE = r"""
import json, shutil, sys, time
from rlrun.sources.plugins import load_builtins
load_builtins()
from rlrun.app.cli import compose
from rlrun.training.trainer import Trainer
mode, out = sys.argv[1], sys.argv[2]
t = Trainer(compose(["+experiment=ppo_cartpole", "tracking=none"] + ([f"output={out}"] if mode == "on" else [])), ".")
t.sample_batch()
t0 = time.perf_counter(); n = 0
for _ in range(600):  # ~300k env steps: a few seconds, long enough for this shared machine's noise
    n += len(t.sample_batch())
for w in t.experience.writers.values():
    w.close()
print(json.dumps({"steps_per_s": n / (time.perf_counter() - t0)}))
t.stop()
"""


def part_write(work: Path, reps: int = 9) -> list[dict[str, object]]:
    out = []
    for rep in range(reps):
        for mode in ("off", "on"):
            shutil.rmtree(work / "written", ignore_errors=True)
            stdout, _ = sh([sys.executable, "-c", WRITE, mode, str(work / "written")], work)
            out.append({"rep": rep, "output": mode, "steps_per_s": round(json.loads(stdout.splitlines()[-1])
                                                                          ["steps_per_s"])})
    return out


def write_csv(rows_: list[dict[str, object]], path: Path) -> None:
    if not rows_:
        return
    keys = [k for k in rows_[0] if k not in ("curve", "trace")]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows_)


def table(rows_: list[dict[str, object]]) -> str:
    keys = [k for k in rows_[0] if k not in ("curve", "trace")]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |"
              for r in rows_]
    return "\n".join(lines)


def plots(results: dict[str, list[dict[str, object]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for r in results.get("marwil", []):
        curve = json.loads(str(r["curve"]))
        axes[0].plot([5 * 2048 * (i + 1) for i in range(len(curve))], curve,
                     color="tab:blue" if r["algo"] == "marwil" else "tab:orange", alpha=0.7,
                     label=f"{r['algo']} seed {r['seed']}")
    axes[0].set(title="mixed data (20 expert + 500 poor episodes)", xlabel="rows trained on",
                ylabel="greedy eval return")
    axes[0].legend(fontsize=7)
    for i, r in enumerate(results.get("ope", [])):
        filled = r.get("family") == "mixture"
        for k, m, c in (("wis", "o", "tab:blue"), ("dr", "s", "tab:green"), ("wdr", "D", "tab:olive"),
                        ("dm", "^", "tab:purple")):
            if k in r:
                axes[1].scatter(r["true"], r[k], marker=m, edgecolors=c, facecolors=c if filled else "none",
                                label=k if i == 0 else None, alpha=0.7)
    lim = [0, 110]
    axes[1].plot(lim, lim, "k--", lw=0.8)
    axes[1].fill_between(lim, [0.85 * x for x in lim], [1.15 * x for x in lim], color="grey", alpha=0.15)
    axes[1].set(title="OPE vs true value (filled: mixture pairs; grey: +-15%)", xlabel="true discounted return",
                ylabel="estimate", xlim=lim, ylim=lim)
    axes[1].legend()
    for r in results.get("memory", []):
        trace = json.loads(str(r["trace"]))
        axes[2].plot([t[0] / 1e6 for t in trace], [t[1] for t in trace])
    axes[2].set(title="reader RSS, 1M-row dataset read 5 times", xlabel="rows read (millions)", ylabel="RSS (MiB)")
    axes[2].set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(RESULTS / "latest.png", dpi=110)


def per_seed(seed: int, parts: list[str], root: Path) -> dict[str, list[dict[str, object]]]:
    work = root / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[dict[str, object]]] = {}
    if "record" in parts:
        part_record(work, seed)
    if "bc" in parts:
        out["bc"] = [part_bc(work, seed)]
    if "marwil" in parts:
        out["marwil"] = part_marwil(work, seed)
    if "dqn" in parts:
        out["dqn"] = [part_dqn(work, seed)]
    if "ope" in parts:
        out["ope"] = part_ope(work, seed)
    print(f"seed {seed} done: {json.dumps({k: len(v) for k, v in out.items()})}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parts", nargs="+", default=["record", "bc", "marwil", "dqn", "ope", "memory", "write"])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    root = args.work or Path(tempfile.mkdtemp(prefix="rlrun-offline-"))
    RESULTS.mkdir(exist_ok=True)
    results: dict[str, list[dict[str, object]]] = {}
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            for got in pool.map(lambda s: per_seed(s, args.parts, root), args.seeds):
                for k, v in got.items():
                    results.setdefault(k, []).extend(v)
        if "memory" in args.parts:
            results["memory"] = [part_memory(root / f"seed{args.seeds[0]}")]
        if "write" in args.parts:
            results["write"] = part_write(root)
    finally:
        if args.work is None:
            shutil.rmtree(root, ignore_errors=True)
    raw = RESULTS / "raw.json"  # every part's rows: a run of some parts keeps the others' results
    merged = {**(json.loads(raw.read_text()) if raw.exists() else {}), **results}
    raw.write_text(json.dumps(merged, indent=1))
    report(merged)


def report(results: dict[str, list[dict[str, object]]]) -> None:
    lines = ["# Offline study: latest results", ""]
    for name, rows_ in results.items():
        write_csv(rows_, RESULTS / f"{name}.csv")
        lines += [f"## {name}", "", table(rows_), ""]
    if "write" in results:
        on = statistics.median(float(r["steps_per_s"]) for r in results["write"] if r["output"] == "on")
        off = statistics.median(float(r["steps_per_s"]) for r in results["write"] if r["output"] == "off")
        lines += [f"median env steps/s with output: {on:.0f}, without: {off:.0f}; ratio {on / off:.3f} "
                  f"(slowdown {100 * (1 - on / off):.1f}%)", ""]
    if "ope" in results:
        lines += ["pairs within 15% of the true value:", ""]
        for family in sorted({str(r.get("family", "checkpoints")) for r in results["ope"]}):
            rs = [r for r in results["ope"] if r.get("family", "checkpoints") == family]
            counts = ", ".join(f"{k} {sum(float(r[f'{k}_err_pct']) <= 15 for r in rs)}/{len(rs)}"
                               for k in OPE_METHODS if f"{k}_err_pct" in rs[0])
            lines += [f"- {family}: {counts}"]
        lines += [""]
    (RESULTS / "latest.md").write_text("\n".join(lines))
    plots(results)
    print((RESULTS / "latest.md").read_text())


if __name__ == "__main__":
    main()
