"""``rlrun-eval``: greedy evaluation of a saved policy, optionally recorded as a video in MLflow.

    rlrun-eval checkpoint=<dir | run output dir | MLflow run id | latest> episodes=20 render=true

Prints the mean/min/max greedy return (``explore=true``: of actions sampled as in training, for
the evaluation, the video and the recording alike). With ``output=<dir>`` it records the episodes
instead, as an offline dataset (Parquet or Minari). With ``render=true``
it also plays ``render_episodes`` episodes on an ``rgb_array`` env and writes them as an animated
GIF. When the checkpoint belongs to an MLflow run, the result (``result.json``) and the video are
logged to that run under ``evaluation/<checkpoint name>/``; otherwise they are written to ``out`` (default
``./rlrun-eval/<checkpoint name>``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlrun.app.resume import resumed_from
from rlrun.config.typed import ConfigError, from_dict
from rlrun.core.errors import DataError, first_line
from rlrun.core.registry import RegistryError
from rlrun.training.checkpoint import CheckpointError, load_meta, resolve_resume

USAGE = __doc__.split("\n\n")[1] if __doc__ else ""


@dataclass
class EvalArgs:
    checkpoint: str = ""  # required
    episodes: int = 20
    num_envs: int = 10
    seed: int = 0
    render: bool = False
    render_episodes: int = 1
    max_frames: int = 1000  # per video; a long episode is cut here
    frame_skip: int = 2  # keep every n-th frame (GIFs of every frame get large)
    tracking_uri: str | None = None  # None: the checkpoint's config, else sqlite:///<cwd>/mlflow.db
    log: bool = True  # log to the checkpoint's MLflow run when it has one
    out: str | None = None  # also write result.json and the video here
    output: str | None = None  # record the episodes as an offline dataset (Parquet) in this directory
    explore: bool = False  # sample actions from the policy's distribution (else greedy): evaluation, video, output
    env: str | None = None  # play on this env id instead of the run's (required for a run without an env)
    experiment: str | None = None  # checkpoint=latest: the newest single run of this experiment (else of any)


EVAL_HELP = """\
usage: rlrun-eval checkpoint=<dir | run output dir | MLflow run id | latest> [key=value ...]

Greedy evaluation of a saved policy: prints the mean/min/max return over the episodes. When the
checkpoint belongs to an MLflow run, the result (and the video) are logged to that run under
evaluation/<checkpoint>/; otherwise they go to ./rlrun-eval/<checkpoint>/ (or out=).

options (defaults in brackets):
  checkpoint=...        a checkpoint dir, a run's output dir, an MLflow run id, or latest (required):
                        the newest checkpoint of a single run here (outputs/; sweep jobs are not taken)
  experiment=NAME       with checkpoint=latest: of a run of this experiment, e.g. ppo_cartpole [any]
  episodes=N            greedy episodes to average [20]
  num_envs=N            envs stepped together [10]
  seed=N                first env seed [0]
  render=true           also record render_episodes episodes as an animated GIF [false]
  render_episodes=N     episodes in the video [1]
  max_frames=N          frames per video at most [1000]
  frame_skip=N          keep every n-th frame [2]
  tracking_uri=URI      MLflow store [the checkpoint's config, else sqlite:///$PWD/mlflow.db]
  log=false             do not log to the checkpoint's MLflow run [true]
  out=DIR               also write result.json and the video here
  output=DIR            record the episodes as an offline dataset (Parquet files) in DIR
  explore=true          sample actions as in training instead of greedy ones [false]
  env=ID                play on this env (its spaces must be the policy's) [the run's env.id;
                        required for a run trained without an env, env.id: null]

examples:
  rlrun-eval checkpoint=latest episodes=20 render=true
  rlrun-eval checkpoint=latest episodes=100 explore=true output=data/cartpole"""


def parse_args(argv: list[str]) -> EvalArgs:
    raw: dict[str, Any] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"expected key=value, got {arg!r}. Usage: {USAGE.strip()}")
        raw[key] = _scalar(value)
    args = from_dict(EvalArgs, raw, "")  # unknown keys and wrong types are named here
    if not args.checkpoint:
        raise ConfigError("checkpoint: missing (a checkpoint dir, a run's output dir, an MLflow run id or latest)")
    for key in ("episodes", "num_envs", "render_episodes", "max_frames", "frame_skip"):
        if getattr(args, key) < 1:
            raise ConfigError(f"{key}: must be >= 1, got {getattr(args, key)}")
    return args


def _scalar(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", ""):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def write_gif(frames: list[np.ndarray], path: Path, fps: float) -> Path:
    """An animated GIF. One 128-colour palette from a sample of frames serves every frame: 4x faster
    than Pillow's per-frame quantising, and no palette flicker."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to write")
    sample = np.concatenate([frames[i] for i in np.linspace(0, len(frames) - 1, 8).astype(int)], axis=0)
    palette = Image.fromarray(sample).quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    images = [Image.fromarray(f).quantize(palette=palette, dither=Image.Dither.NONE) for f in frames]
    duration = max(20, round(1000 / fps / 10) * 10)  # GIF delays are in 10 ms units
    images[0].save(path, save_all=True, append_images=images[1:], duration=duration, loop=0)
    return path


def record_video(policies: dict[str, Any], cfg: Any, args: EvalArgs) -> tuple[list[np.ndarray], list[float], float]:
    """Episodes (greedy unless ``explore=true``) on an env that renders: the frames, the episodes'
    returns and the frame rate."""
    from rlrun.training.evaluation import render_run

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off-screen; no display needed
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    return render_run(policies, cfg, args.render_episodes, args.seed, args.max_frames, args.frame_skip, args.explore)


def _with_env(loaded: Any, env_id: str | None, path: Path) -> Any:
    """The checkpoint's config, playing on ``env_id`` when given (a policy trained without an env, or
    on another env with the same spaces)."""
    from dataclasses import replace

    from rlrun.data.spaces import same_space
    from rlrun.envs.make import check_env_id, probe_env

    cfg = loaded.cfg
    if env_id is None:
        if cfg.env.id is None:
            raise ConfigError(f"env: checkpoint {path} is of a run without an env (env.id: null); name one to play "
                              "on: env=<gymnasium id>")
        return cfg
    if cfg.multiagent.policies:
        raise ConfigError(f"env: {env_id}: a multi-agent run plays on its own env")
    check_env_id(env_id)
    spaces = probe_env(env_id)
    for what, ours, theirs in zip(("observation", "action"), (loaded.obs_space, loaded.action_space), spaces,
                                   strict=True):
        if not same_space(ours, theirs):
            raise ConfigError(f"env: {env_id} has the {what} space {theirs}, the policy's is {ours}")
    return replace(cfg, env=replace(cfg.env, id=env_id, kwargs={}, wrappers=[], observation_space=None,
                                    action_space=None))


def _logged_run(info: dict[str, Any], path: Path, uri: str) -> str | None:
    """The MLflow run of a checkpoint: its recorded id, else the run tagged with its run key (the
    checkpoint was written before the writer had created the run, which may still be finishing)."""
    key = info.get("rlrun_run_key")
    if info.get("mlflow_run_id") or not key:
        return info.get("mlflow_run_id")
    from rlrun.tracking.mlflow_runs import open_store, run_with_key
    from rlrun.tracking.pending import finish_pending

    try:
        finish_pending(path)
    except TimeoutError as e:
        raise CheckpointError(f"checkpoint={path}: {e}") from None
    return run_with_key(open_store(uri), key)


def evaluate_checkpoint(args: EvalArgs, launch_dir: Path) -> dict[str, Any]:
    from rlrun.tracking.tracker import default_tracking_uri
    from rlrun.training.evaluation import evaluate_run
    from rlrun.training.export import describe, load_policies

    with tempfile.TemporaryDirectory(prefix="rlrun-eval-") as tmp:
        uri = args.tracking_uri or default_tracking_uri(launch_dir)
        path = resolve_resume(args.checkpoint, launch_dir, uri, Path(tmp) / "download", key="checkpoint",
                              experiment=args.experiment)
        if args.checkpoint == "latest":
            print(f"rlrun-eval: latest: {resumed_from(path, load_meta(path))}", flush=True)
        everyone = load_policies(path, launch_dir)
        loaded = next(iter(everyone.values()))
        policies = {pid: lp.policy for pid, lp in everyone.items()}
        about = describe(loaded)
        for p in policies.values():  # epsilon and other schedules continue from where training stopped
            p.global_timestep = int(about.get("timesteps_total") or 0)
        cfg = _with_env(loaded, args.env, path)
        uri = args.tracking_uri or cfg.tracking.tracking_uri or uri
        if args.output:
            res = _record(args, policies, cfg)
        else:
            res = evaluate_run(policies, cfg, args.episodes, args.num_envs, args.seed, explore=args.explore)
        info = {**about, "checkpoint": str(path), **res.metrics(), "returns": res.returns}
        _print_result(f"{cfg.env.id}, {cfg.algo.name} checkpoint {path.name}", info, res, args.explore)
        run_id = _logged_run(info, path, uri) if args.log and cfg.tracking.backend == "mlflow" else None
        out = Path(args.out) if args.out else (Path(tmp) / "out" if run_id else
                                               launch_dir / "rlrun-eval" / path.name)
        out.mkdir(parents=True, exist_ok=True)
        if args.render:
            frames, video_returns, fps = record_video(policies, cfg, args)
            video = write_gif(frames, out / "episode.gif", fps)
            info.update(video=video.name, video_returns=video_returns, video_frames=len(frames))
            print(f"rlrun-eval: recorded {args.render_episodes} episode(s), {len(frames)} frames "
                  f"(returns {', '.join(f'{r:.1f}' for r in video_returns)})", flush=True)
        (out / "result.json").write_text(json.dumps(info, indent=2, default=str))
        if run_id:
            from mlflow.tracking import MlflowClient

            dest = f"evaluation/{path.name}"
            try:
                MlflowClient(tracking_uri=uri).log_artifacts(run_id, str(out), dest)
            except Exception as e:
                raise CheckpointError(f"checkpoint={args.checkpoint}: cannot log to MLflow run {run_id} at {uri}: "
                                      f"{first_line(e)}") from None
            info["artifact_path"] = dest
            print(f"rlrun-eval: logged {', '.join(sorted(p.name for p in out.iterdir()))} to MLflow run {run_id} "
                  f"under {dest}/", flush=True)
        else:
            print(f"rlrun-eval: wrote {out}", flush=True)
    return info


def _print_result(what: str, info: dict[str, Any], res: Any, explore: bool) -> None:
    kind = "sampled-action" if explore else "greedy"
    print(f"rlrun-eval: {what} ({info['timesteps_total']} env steps): {kind} return over {len(res.returns)} episodes: "
          f"mean {info['eval/episode_return_mean']:.2f}, min {info['eval/episode_return_min']:.2f}, "
          f"max {info['eval/episode_return_max']:.2f}", flush=True)
    if res.policy_returns:  # named policies (a zero-sum game sums to 0): each one's agents' mean return
        print("rlrun-eval: policies: " + ", ".join(f"{pid} {float(np.mean(r)):.2f}"
                                                   for pid, r in res.policy_returns.items()), flush=True)
    for pid, seats in (res.seat_returns or {}).items():  # env.shuffle_seats: each seat's mean (games)
        print(f"rlrun-eval: seats: {pid} " + ", ".join(f"as {seat} {float(np.mean(r)):.2f} ({len(r)})"
                                                     for seat, r in seats.items()), flush=True)


def _record(args: EvalArgs, policies: dict[str, Any], cfg: Any) -> Any:
    """``output=``: the episodes recorded as a dataset; their returns as the result."""
    from rlrun.sources.record import record_dataset
    from rlrun.training.evaluation import EvalResult

    writer = record_dataset(policies, cfg, str(args.output), args.episodes, args.num_envs, args.seed, args.explore)
    where = "as a Minari dataset" if not writer.files else f"in {len(writer.files)} Parquet file(s)"
    print(f"rlrun-eval: recorded {len(writer.episode_returns)} episodes, {writer.rows_written} rows, {where} to "
          f"{args.output}", flush=True)
    return EvalResult(writer.episode_returns, writer.episode_lengths)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(EVAL_HELP)
        return
    try:
        args = parse_args(argv)
        evaluate_checkpoint(args, Path(os.getcwd()).resolve())
    except (ConfigError, CheckpointError, RegistryError, DataError) as e:
        print(f"rlrun-eval: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
