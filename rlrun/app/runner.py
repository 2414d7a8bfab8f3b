"""``run(cfg)``: build the trainer, train until a stop criterion, checkpoint, track, return.

Tests and the CLI both call this; it takes a validated ``RunConfig`` or plain config data.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rlrun.algos.algorithm import check_algorithm_fits, get_algorithm
from rlrun.app.resume import resume_checkpoint, resumed_from
from rlrun.app.run_files import (
    RUN_KEY_META,
    RUN_NAME_META,
    check_output_dir_is_ours,
    default_output_dir,
    write_checkpoint,
)
from rlrun.app.run_hooks import build_run_hooks, mlflow_row
from rlrun.app.run_record import action_dist_tags, default_run_name, run_tags
from rlrun.app.torch_compute import flush_denormals, set_torch_compute
from rlrun.config.multi_agent import learned_policy_sections
from rlrun.config.offline import SAMPLER
from rlrun.config.resources import check_replay_memory
from rlrun.config.schemas import DEFAULT_EXPERIMENT, RunConfig
from rlrun.config.typed import ConfigError, to_dict
from rlrun.core.errors import RunInterrupted, Terminated
from rlrun.core.history import HISTORY_FILE, MetricHistory, read_results, read_rows
from rlrun.core.metrics import DEFAULT_POLICY_ID, STOP_COUNTERS
from rlrun.core.provenance import BOOKKEEPING, RECORD_DIR, params_from_config
from rlrun.core.sweep_info import SweepJob
from rlrun.policy.policy_map import run_spaces
from rlrun.sources.offline_input import check_input
from rlrun.sources.plugins import load_plugins
from rlrun.tracking.mlflow_runs import RUN_KEY_TAG
from rlrun.tracking.pending import PENDING_FILE
from rlrun.tracking.progress import ProgressLine, Summary
from rlrun.tracking.tracker import Tracker, TrackingError, make_tracker
from rlrun.training.checkpoint import Checkpoint
from rlrun.training.export import save_actors
from rlrun.training.ope import check_evaluation_data
from rlrun.training.trainer import Trainer
from rlrun.training.validate import build_config


@dataclass
class RunResult:
    metrics: dict[str, float]  # the last iteration's result
    stop_reason: str
    target_met: bool  # a metric threshold in `stop` was reached (not just a budget)
    checkpoint_dir: Path
    output_dir: Path
    run_id: str | None = None
    history_file: Path | None = None  # the run's metrics.jsonl (every iteration, resumes included)
    history_start: int = 0  # this process's iterations: from this row on

    @property
    def history(self) -> list[dict[str, float]]:
        """This process's iterations' numbers, read from the run's ``metrics.jsonl`` when asked for."""
        return read_results(self.history_file, self.history_start)


def stop_reason(stop: Mapping[str, float], result: Mapping[str, float]) -> str | None:
    """The first criterion met (``result[key] >= value``), or None. NaN never meets one."""
    for key, value in stop.items():
        v = result.get(key)
        if v is not None and not math.isnan(v) and v >= value:
            return f"{key} = {v:g} >= {value:g}"
    return None


def target_met(stop: Mapping[str, float], result: Mapping[str, float]) -> bool:
    """A metric threshold of ``stop`` was reached (a counter budget running out does not count)."""
    return any(stop_reason({k: v}, result) for k, v in stop.items() if k not in STOP_COUNTERS)


def run(cfg: RunConfig | Mapping[str, Any], launch_dir: str | Path | None = None,
        sweep: SweepJob | None = None, background_finish: bool = False,
        job_overrides: Sequence[str] | None = None, extra_tags: Mapping[str, str] | None = None) -> RunResult:
    """Train until ``cfg.stop``; returns the final metrics. ``launch_dir`` anchors relative
    defaults (the MLflow store, plugin imports); it defaults to the current directory. ``sweep``
    makes the MLflow run a child of a sweep's parent run (see rlrun/app/sweep.py). ``background_finish``
    (the ``rlrun`` command, ``tracking.wait: false``): a finished run returns without waiting for
    the MLflow writer's last work (see rlrun/tracking/pending.py). ``job_overrides``: a sweep job's
    overrides (its ``resume=latest`` is its own job's checkpoint). ``extra_tags``: more MLflow tags (a rerun's)."""
    t0 = time.monotonic()
    ctx = start_run(cfg, Path(launch_dir or os.getcwd()).resolve(), sweep, job_overrides, extra_tags)
    ctx.background_finish = background_finish
    interrupted: KeyboardInterrupt | None = None
    failed: BaseException | None = None
    try:
        ctx.trainer = make_trainer_from(ctx.cfg, ctx.launch)
        if ctx.resumed:
            ctx.trainer.set_state(ctx.resumed.state)
            _replay_history(ctx)
        workers = ctx.trainer.workers
        if workers.ray_address:  # where the Ray workers run: ray.worker.<i>.node = <resources or head>:<node id>
            nodes = workers.placement() or {}
            ctx.tracker.set_tags({"ray.address": workers.ray_address,
                                  **{f"ray.worker.{i}.node": node for i, node in nodes.items()}})
        _loop(ctx, ctx.trainer)
        ctx.status = "FINISHED"
    except KeyboardInterrupt as e:
        ctx.status, ctx.reason = "KILLED", f"interrupted ({'SIGTERM' if isinstance(e, Terminated) else 'Ctrl-C'})"
        interrupted = e
        raise
    except BaseException as e:
        ctx.reason = f"failed: {type(e).__name__}: {e}"
        failed = e
        with contextlib.suppress(TrackingError):  # a broken tracker must not hide the real error
            ctx.tracker.set_tags({"rlrun.error": f"{type(e).__name__}: {e}"[:5000]})
        raise
    finally:
        try:
            finish_run(ctx)
        except TrackingError:
            if failed is None and interrupted is None:
                raise  # otherwise the run's own error (already propagating) is the one to report
        if interrupted is not None:  # what the CLI tells the user
            raise RunInterrupted(isinstance(interrupted, Terminated),
                                 str(ctx.checkpoint) if ctx.checkpoint_written else None) from interrupted
    met = target_met(ctx.cfg.stop, ctx.result)
    # progress=false silences the live line only: the summary says where the run went
    print("\n".join(Summary(ctx.reason, met, ctx.results, time.monotonic() - t0, ctx.out_dir,
                             ctx.checkpoint if ctx.checkpoint_written else None, ctx.run_name,
                             ctx.tracker.run_id, ctx.tracker.experiment_name or "", ctx.tracker.uri,
                             ctx.tracker.experiment_id, ctx.writer_pid,
                             ctx.cfg.metrics_num_episodes_for_smoothing, ctx.resumed_from).lines()), flush=True)
    return RunResult(ctx.result, ctx.reason, met, ctx.checkpoint, ctx.out_dir, ctx.tracker.run_id, ctx.history.path,
                     ctx.history_start)


@dataclass
class RunContext:
    """What the three steps of a run share."""

    cfg: RunConfig
    launch: Path
    out_dir: Path
    config_dict: dict[str, Any]
    tracker: Tracker
    sweep: SweepJob | None
    resumed: Checkpoint | None
    progress: ProgressLine
    trainer: Trainer | None = None
    result: dict[str, float] = field(default_factory=dict)
    # every iteration of the run (resumes included) in <output_dir>/metrics.jsonl, not in memory
    history: MetricHistory = field(default_factory=lambda: MetricHistory(None))
    history_start: int = 0  # this process's iterations: from this row on
    results: list[dict[str, float]] = field(default_factory=list)  # this process's, read back at its end (_shown)
    checkpoint_written: bool = False
    reason: str = "not started"
    status: str = "FAILED"
    checkpoint: Path = Path()
    run_name: str | None = None
    run_key: str = ""  # rlrun.run_key: names the MLflow run before it exists (see write_checkpoint)
    resumed_from: str | None = None  # the checkpoint it continued, its iteration, steps and MLflow run
    used_metrics: set[str] = field(default_factory=set)  # ZERO_UNTIL_USED metrics seen non-zero
    step_offset: int = 0  # MLflow step - timesteps_total (a Tune trial that took another's checkpoint)
    background_finish: bool = False
    writer_pid: int | None = None  # the MLflow writer still finishing the run after run() returns


def _validated(cfg: RunConfig | Mapping[str, Any], launch: Path) -> RunConfig:
    if isinstance(cfg, RunConfig):
        load_plugins(cfg.plugins, search_dirs=[launch])
        return cfg
    load_plugins(list(cfg.get("plugins") or []), search_dirs=[launch])
    return build_config(dict(cfg))


def _check_policies(cfg: RunConfig, spaces: Mapping[str, tuple[Any, Any]]) -> None:
    """Each learned policy's algorithm against its spaces and model (one line, before anything starts)."""
    for pid, prefix, sections in learned_policy_sections(cfg):
        check_algorithm_fits(get_algorithm(sections.algo.name), sections.model, *spaces[pid], prefix=prefix,
                             observation_filter=cfg.rollout.observation_filter)


def start_run(raw_cfg: RunConfig | Mapping[str, Any], launch: Path, sweep: SweepJob | None,
              job_overrides: Sequence[str] | None = None, extra_tags: Mapping[str, str] | None = None,
              run_key: str | None = None) -> RunContext:
    """Validate, write the resolved config, check a resume, start the MLflow run. ``run_key``: the run's
    own name (a Tune trial's): the MLflow run and the history in ``output_dir`` that carry it continue."""
    flush_denormals()  # before validation's first torch operation starts torch's threads
    cfg = set_torch_compute(_validated(raw_cfg, launch))  # the threads it runs with, recorded
    spaces = run_spaces(cfg, probe=True)  # env API mistakes, agents no policy covers: one line, before anything starts
    _check_policies(cfg, spaces)
    check_replay_memory(cfg, spaces)  # the replay buffers, sized with the env's observations
    if cfg.offline.evaluation:  # the held-out episodes exist, have the columns, and fit the methods
        check_evaluation_data(cfg, spaces[DEFAULT_POLICY_ID][1])  # offline data: single-agent runs (config checks)
    if cfg.input != SAMPLER or cfg.offline.evaluation:  # every input file: footer, columns, spaces, rewards
        check_input(cfg, *spaces[DEFAULT_POLICY_ID])
    out_dir = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(launch)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / ".rlrun-write-test").touch()
        (out_dir / ".rlrun-write-test").unlink()
    except OSError as e:
        raise ConfigError(f"output_dir: cannot write to {out_dir}: {e.strerror or e}") from None
    _check_store_dir(cfg)
    config_dict = to_dict(cfg)
    action_spaces = [space for _, space in spaces.values()]
    resumed, changes, resume_path = resume_checkpoint(cfg, launch, out_dir, config_dict, job_overrides, action_spaces)
    resumed_text = resumed_from(resume_path, resumed.meta) if resumed and resume_path else None
    if resumed_text:
        print(f"rlrun: resuming {resumed_text}", flush=True)
    resume_run_id = resumed.meta.get("mlflow_run_id") if resumed else None
    # the run's own name, in every checkpoint from the first on: a resumed run keeps it
    continued = run_key is not None and not resumed
    run_key = (resumed.meta.get(RUN_KEY_META) if resumed else None) or run_key or secrets.token_hex(16)
    check_output_dir_is_ours(out_dir, run_key, resume_run_id)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config_dict, sort_keys=False))
    # a resumed run is the same MLflow run: it keeps its name (checkpoints before 2026-11-26 have none)
    run_name = cfg.tracking.run_name or (resumed.meta.get(RUN_NAME_META) if resumed else None) or default_run_name(cfg)
    tracker = make_tracker(replace(cfg.tracking, run_name=run_name), launch, cfg.experiment or DEFAULT_EXPERIMENT,
                           resume_run_id, run_key if resumed or continued else None)
    tags = {**run_tags(cfg, launch, out_dir), **action_dist_tags(cfg, spaces), "rlrun.output_dir": str(out_dir),
            RUN_KEY_TAG: run_key,
            **{f"rlrun.{k}": str(config_dict[k]) for k in BOOKKEEPING if k != "output_dir"}}
    if resumed:
        tags["rlrun.resumed_from"] = str(resume_path)
        tags["rlrun.resume_changes"] = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())[:5000]
    if sweep is not None:
        tags.update(sweep.tags)
    tracker.start(params_from_config(config_dict), {**tags, **(extra_tags or {})})
    if sweep is not None:
        sweep.recorded = True
    tracker.log_artifact(out_dir / "config.yaml")
    tracker.log_artifacts(out_dir / RECORD_DIR, RECORD_DIR)
    progress = ProgressLine(cfg.progress, stop=cfg.stop, evaluated=cfg.evaluation.interval > 0)
    own = out_dir / HISTORY_FILE  # a continued run's (a Tune trial restarted) is in its output dir
    rows = read_rows(resumed.history_file) if resumed and resumed.history_file else (
        read_rows(own) if continued and own.is_file() else iter(()))
    history = MetricHistory(out_dir / HISTORY_FILE, rows)
    return RunContext(cfg, launch, out_dir, config_dict, tracker, sweep, resumed, progress,
                       checkpoint=out_dir / "checkpoints", history=history, history_start=len(history),
                       run_name=run_name, run_key=run_key, resumed_from=resumed_text)


def _replay_history(ctx: RunContext) -> None:
    """Resume: send the iterations the checkpoint covers that MLflow never got (the trainer was
    killed before its writer sent them); steps MLflow holds are skipped by the tracker."""
    ctx.tracker.wait_started()  # learn which env steps MLflow already holds
    used: set[str] = set()
    for metrics, step, ts in ctx.history.rows():
        ctx.tracker.log_metrics(mlflow_row(metrics, used), step, ts)


def _check_store_dir(cfg: RunConfig) -> None:
    """A SQLite tracking store must be creatable where it is asked for, before anything starts."""
    uri = cfg.tracking.tracking_uri
    if cfg.tracking.backend != "mlflow" or not uri:
        return
    if uri.startswith(("http://", "https://")):
        _check_server(uri)
        return
    if not uri.startswith("sqlite:///"):
        return
    parent = Path(uri[len("sqlite:///"):]).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"tracking.tracking_uri: cannot create the store's directory {parent}: "
                          f"{e.strerror or e}") from None
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"tracking.tracking_uri: the store's directory {parent} is not writable")


def _check_server(uri: str, timeout_s: float = 5.0) -> None:
    """Something must listen at an MLflow server's address (MLflow itself retries for minutes)."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(uri)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "localhost", port), timeout=timeout_s):
            pass
    except OSError as e:
        raise ConfigError(f"tracking.tracking_uri: no MLflow server answers at {uri} "
                          f"({e.strerror or type(e).__name__})") from None


def _loop(ctx: RunContext, trainer: Trainer) -> None:
    """Iterate until a stop criterion is met; after each iteration the run's hooks (rlrun/app/run_hooks.py:
    record it in the history and MLflow, show progress, periodic checkpoints)."""
    hooks = build_run_hooks(ctx.cfg)
    while True:
        ctx.result = trainer.train()
        met = stop_reason(ctx.cfg.stop, ctx.result)
        if met:
            evaluate_last(ctx.cfg, trainer, ctx.result)
        for hook in hooks:
            hook.after_iteration(ctx, trainer, ctx.result)
        if met:
            ctx.reason = met
            return


def evaluate_last(cfg: RunConfig, trainer: Trainer, result: dict[str, Any]) -> None:
    """``evaluation.final``: a run whose last iteration falls between two evaluations evaluates its last
    policy too (as the final checkpoint holds it), into that iteration's ``result``."""
    ev = cfg.evaluation
    if ev.final and ev.interval and trainer.iteration % ev.interval:
        result.update(trainer.evaluate().metrics())


def finish_run(ctx: RunContext, final_checkpoint: bool = True) -> None:
    """Final checkpoint (unless not ``final_checkpoint``), MLflow model and run description, then stop
    workers and end the run."""
    ctx.progress.close(ctx.result or None)
    ctx.results = ctx.history.results(ctx.history_start, keep=_shown)  # for the summary and the curve
    ctx.history.close()
    trainer = ctx.trainer
    try:
        if trainer is not None and trainer.iteration > 0:
            if final_checkpoint:  # (a Tune trial's checkpoints are Tune's: rlrun/app/tune_trainable.py)
                ctx.checkpoint = write_checkpoint(trainer, ctx.cfg, ctx.result, ctx.out_dir, ctx.config_dict,
                                                  ctx.tracker, ctx.history, ctx.run_key, ctx.run_name)
                ctx.checkpoint_written = True
                if ctx.status == "FINISHED" and ctx.cfg.tracking.log_model:
                    ctx.tracker.log_model(ctx.checkpoint, ctx.launch, _actors(ctx, trainer))
            _describe_run(ctx.cfg, ctx.results, ctx.reason, ctx.tracker)
    finally:
        if trainer is not None:
            trainer.stop(finished=ctx.status == "FINISHED")
        if ctx.sweep is not None and ctx.sweep.log_file is not None:
            ctx.tracker.log_artifact(ctx.sweep.log_file)
        if ctx.background_finish and ctx.status == "FINISHED" and ctx.sweep is None:
            ctx.writer_pid = ctx.tracker.end_in_background(ctx.status, ctx.out_dir / PENDING_FILE)
        else:
            ctx.tracker.end(ctx.status)


ACTORS_DIR = "mlflow_model"  # in the run's output dir: the traced actors the writer logs


def _actors(ctx: RunContext, trainer: Trainer) -> Path | None:
    """The policies' greedy actors traced for the MLflow model (``None``: the writer traces them from
    the checkpoint); a policy that cannot be traced costs the model, not the run (the writer says so)."""
    try:
        return save_actors(trainer.policies, ctx.cfg, ctx.checkpoint, ctx.out_dir / ACTORS_DIR)
    except Exception:  # the writer's own attempt reports what is wrong
        return None


def _shown(metric: str) -> bool:
    """What the summary and the learning curve read of every iteration (the last one is read whole)."""
    return metric == "timesteps_total" or metric.endswith("/episode_return_mean")


def _describe_run(cfg: RunConfig, history: list[dict[str, float]], reason: str, tracker: Any) -> None:
    """Learning-curve artifact, a run description and target/stop tags for the MLflow run page."""
    if not history:  # the first iteration failed after its update (e.g. in a callback's on_train_result)
        return
    key = "rollout/episode_return_mean"
    points = [(h["timesteps_total"], h[key]) for h in history if key in h]
    returns = [y for _, y in points if not math.isnan(y)]
    met = target_met(cfg.stop, history[-1])
    final = f"{returns[-1]:.1f}" if returns else "n/a"
    best = f"{max(returns):.1f}" if returns else "n/a"
    note = (f"**{cfg.experiment or 'default'}**: algo `{cfg.algo.name}` (loss `{cfg.loss.name}`) on `{cfg.env.label}`, "
            f"seed {cfg.seed}. Final return {final}, best {best} after {int(history[-1]['timesteps_total']):,} env "
            f"steps. Stopped: {reason}. Target met: {'yes' if met else 'no'}.")
    evals = [(h["timesteps_total"], h["eval/episode_return_mean"]) for h in history if "eval/episode_return_mean" in h]
    tracker.log_learning_curve(points, f"{cfg.experiment or cfg.algo.name}: {cfg.env.label}", evals,
                               cfg.metrics_num_episodes_for_smoothing)
    tracker.set_tags({"mlflow.note.content": note, "rlrun.target_met": str(met).lower(), "rlrun.stop_reason": reason})


def make_trainer_from(cfg: RunConfig, launch_dir: str | Path | None = None) -> Trainer:
    """A Trainer for a validated config (plugins imported)."""
    return Trainer(cfg, launch_dir)


def make_trainer(overrides: list[str] | None = None, launch_dir: str | Path | None = None) -> Trainer:
    """A ready Trainer for ``rlrun <overrides>`` without running it (notebooks, debugging)::

        from rlrun import make_trainer
        trainer = make_trainer(["+experiment=ppo_cartpole"])
        print(trainer.workers.local_worker.sample())   # a SampleBatch summary
    """
    from rlrun.app.compose import compose

    cfg = set_torch_compute(compose(list(overrides or []), str(launch_dir or os.getcwd())))
    _check_policies(cfg, run_spaces(cfg, probe=True))  # as a run does: one line before anything starts
    return make_trainer_from(cfg, launch_dir)
