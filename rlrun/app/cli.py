"""The ``rlrun`` command: Hydra composes the config, rlrun validates it, then ``run(cfg)``.

This is the only module that sees a DictConfig. Config mistakes exit with status 2 and one line
naming the key and the value, before any env, model or Ray starts.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlrun.app.compose import compose as compose  # re-exported: tests and tools compose through the CLI module
from rlrun.app.compose import compose_to_config
from rlrun.config.typed import ConfigError
from rlrun.core.errors import (
    CheckpointError,
    DataError,
    NonFiniteLossError,
    PluginError,
    RayConnectionError,
    RunInterrupted,
    Terminated,
    WorkerFailure,
    is_sigterm,
)
from rlrun.core.registry import RegistryError
from rlrun.tracking.tracker import TrackingError

USER_ERRORS = (ConfigError, RegistryError, CheckpointError, TrackingError, RayConnectionError, PluginError, DataError)


@hydra.main(version_base="1.3", config_path="pkg://rlrun.conf", config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from rlrun.app.runner import run

    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        if cfg.get("tune") is not None:
            print("rlrun: error: tune: a Tune population runs without -m (its trials are Tune's)", file=sys.stderr)
            sys.exit(2)
        return sweep_job(cfg)
    launch_dir = os.getcwd()  # version_base 1.3: Hydra does not chdir
    try:
        tune_section = _take_tune_section(cfg)
        if tune_section is not None:  # a population of runs with Ray Tune (rlrun/app/tune_run.py)
            from rlrun.app.tune_run import run_tune

            base = OmegaConf.to_container(cfg, resolve=False)  # trials resolve it with their values
            run_cfg = compose_to_config(cfg, launch_dir, hc.runtime.choices.get("experiment"), None)
            sys.exit(run_tune(run_cfg, base, tune_section, Path(launch_dir), hc.runtime.output_dir))
        run_cfg = compose_to_config(cfg, launch_dir, hc.runtime.choices.get("experiment"),
                                    hc.runtime.output_dir)
        result = run(run_cfg, launch_dir=launch_dir, background_finish=not run_cfg.tracking.wait)
    except USER_ERRORS as e:
        from rlrun.app.cli_errors import blame_preset

        print(f"rlrun: error: {blame_preset(str(e), hc.runtime.choices.get('experiment'), list(hc.overrides.task))}",
              file=sys.stderr)
        sys.exit(2)
    except (WorkerFailure, NonFiniteLossError) as e:
        print(f"rlrun: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as e:
        sys.exit(_interrupted(e))
    return result.metrics.get("rollout/episode_return_mean")


def _take_tune_section(cfg: DictConfig) -> dict[str, Any] | None:
    """The ``tune`` section (``tune=pbt``), removed from the run config; None without one."""
    from omegaconf import open_dict

    if cfg.get("tune") is None:
        return None
    section = OmegaConf.to_container(cfg.tune, resolve=True)
    with open_dict(cfg):
        del cfg["tune"]
    if not isinstance(section, dict):
        raise ConfigError(f"tune: expected a mapping (e.g. tune=pbt), got {section!r}")
    return {str(k): v for k, v in section.items()}


def _interrupted(e: KeyboardInterrupt) -> int:
    """Tell what an interrupted run kept; the exit status: 143 for SIGTERM, 130 for Ctrl-C."""
    ckpt = e.checkpoint if isinstance(e, RunInterrupted) else None
    kept = f"final checkpoint {ckpt}" if ckpt else "no checkpoint (no iteration had finished)"
    what = "terminated (SIGTERM)" if is_sigterm(e) else "interrupted"
    print(f"rlrun: {what}; {kept}; MLflow run marked KILLED", file=sys.stderr)
    return 143 if is_sigterm(e) else 130


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def sweep_job(cfg: DictConfig) -> float:
    """One job of ``rlrun -m``: a child MLflow run of the sweep. It never raises: a failure is
    recorded (FAILED child, ``rlrun.error`` tag, ``job.log``) and NaN returned, so the sweep goes on."""
    from dataclasses import replace

    from rlrun.app.runner import run
    from rlrun.app.sweep import Tee, record_failed_job
    from rlrun.core.quiet import short_floats
    from rlrun.core.sweep_info import SweepJob, objective_value, read_sweep_info

    hc = HydraConfig.get()
    launch_dir = hc.runtime.cwd  # the driver's directory, also for jobs in Ray tasks
    out_dir = Path(hc.runtime.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(hc.overrides.task)
    name = f"job {hc.job.num}: {short_floats(' '.join(overrides))}"[:250]
    info = read_sweep_info(hc.sweep.dir)
    if info is not None:
        from rlrun.tracking.tracker import use_shared_writer

        use_shared_writer(info.writer_address)
    log_path = out_dir / "job.log"
    job = None
    if info is not None:
        tags = {"mlflow.parentRunId": info.parent_run_id, "rlrun.overrides": " ".join(overrides)[:5000],
                "rlrun.job_num": str(hc.job.num), "mlflow.runName": name}
        job = SweepJob(info, tags, log_path)
    with open(log_path, "w") as log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Tee(out, log), Tee(err, log)
        try:
            print(f"rlrun: {name}", flush=True)
            run_cfg = compose_to_config(cfg, launch_dir, hc.runtime.choices.get("experiment"), str(out_dir))
            if info is not None:
                run_cfg = replace(run_cfg, tracking=replace(
                    run_cfg.tracking, tracking_uri=info.tracking_uri, experiment_name=info.experiment_name,
                    run_name=run_cfg.tracking.run_name or name))
            result = run(run_cfg, launch_dir=launch_dir, sweep=job, job_overrides=overrides)
            value = objective_value(run_cfg.objective, result)
            print(f"rlrun: {name}: {run_cfg.objective} = {value:g}", flush=True)
            return value
        except Exception as e:
            known = (*USER_ERRORS, WorkerFailure, NonFiniteLossError)
            msg = str(e) if isinstance(e, known) else f"{type(e).__name__}: {e}"
            print(f"rlrun: {name}: failed: {msg}", file=sys.stderr, flush=True)
            if job is not None and not job.recorded:
                try:
                    record_failed_job(job, msg)
                except Exception as e2:  # never let bookkeeping sink the sweep
                    print(f"rlrun: could not record the failed job in MLflow: {e2}", file=sys.stderr)
            return float("nan")
        finally:
            sys.stdout, sys.stderr = out, err


def _rerun(argv: list[str]) -> int:
    """``rlrun rerun=<run> [key=value ...]`` (rlrun/app/rerun.py); its exit status."""
    from rlrun.app.rerun import rerun

    specs = [a for a in argv if a.startswith("rerun=")]
    extra = [a for a in argv if not a.startswith("rerun=")]
    try:
        if len(specs) > 1 or any(a.startswith("-") for a in extra):
            raise ConfigError(f"{specs[0]}: one run at a time, without Hydra flags (got: {' '.join(argv)})")
        import signal

        signal.signal(signal.SIGTERM, _on_sigterm)
        rerun(specs[0][len("rerun="):], extra, Path.cwd())
    except USER_ERRORS as e:
        print(f"rlrun: error: {e}", file=sys.stderr)
        return 2
    except (WorkerFailure, NonFiniteLossError) as e:
        print(f"rlrun: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        return _interrupted(e)
    return 0


GROUPS = ("algo", "loss", "model", "env", "rollout", "tracking", "debug", "experiment", "hparams_search", "tune")


def check_group_choices(argv: list[str]) -> str | None:
    """An error message for ``group=option`` overrides naming no packaged config, else None.

    Hydra would say "Could not find 'algo/ppoo'"; we add "did you mean". Skipped when the user adds
    config directories (their options are not known here) and for sweep functions like ``choice(...)``.
    """
    if any(a.startswith(("--config-dir", "-cd", "--config-path", "-cp", "hydra.searchpath")) for a in argv):
        return None
    conf = files("rlrun.conf")
    for arg in argv:
        m = re.fullmatch(r"\+{0,2}(\w+)=([\w.,\- ]*)", arg)
        if not m or m[1] not in GROUPS:
            continue
        options = sorted(p.name[:-5] for p in conf.joinpath(m[1]).iterdir() if p.name.endswith(".yaml"))
        for choice in (c.strip() for c in m[2].split(",")):
            if choice and choice != "null" and choice not in options:
                from rlrun.app.cli_errors import unknown_choice_line

                return unknown_choice_line(m[1], choice, options, argv)
    return None


def main() -> None:
    """The ``rlrun`` command. Ends the process itself once everything is written: exit handlers
    (Ray's shutdown, logging) run, the interpreter's teardown is skipped - with Ray's C++ core worker,
    torch and mlflow loaded it takes ~2 s and writes nothing of ours."""
    argv = set(sys.argv[1:])
    # a sweep has its shared writer; help, version and Hydra's print-and-exit flags never track
    no_run = {"-m", "--multirun", "--help", "-h", "--version", "tracking=none", "--cfg", "-c", "--info", "-i",
              "--hydra-help", "--shell-completion", "-sc"}
    if not argv & no_run and not any(re.match(r"\+*tune=", a) for a in argv):  # a Tune population: trials track
        from rlrun.tracking.tracker import start_writer_early

        start_writer_early()
    exit_now(exit_status())


def exit_status() -> int:
    """Run the command (``sys.argv``) and return its exit status; the process stays up."""
    code: int | str | None
    try:
        code = _cli()
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):  # sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    return int(code or 0)


def exit_now(code: int) -> None:
    from rlrun.core.fast_exit import exit_now as _exit_now

    try:
        if "ray" in sys.modules:  # a sweep's Ray instance: stopped now, without Ray's exit-time pause
            from rlrun.sources.ray_instance import shutdown_ray

            shutdown_ray()
    finally:
        _exit_now(code)


def _cli() -> int:
    from rlrun.app.sweep import OUTCOME, end_interrupted_sweep
    from rlrun.core.quiet import quiet_libraries, take_verbose_flag

    argv = take_verbose_flag(sys.argv[1:])
    sys.argv[1:] = argv  # Hydra never sees -v
    quiet_libraries()
    if "--version" in argv:
        from rlrun.app.cli_help import version_text

        print(version_text())
        return 0
    if "--help" in argv or "-h" in argv:
        from rlrun.app.cli_help import help_text

        print(help_text([a for a in argv if a not in ("--help", "-h")]))
        return 0
    if any(a.startswith("rerun=") for a in argv):  # a recorded run again: its config, not Hydra's composition
        return _rerun(argv)
    if {"-m", "--multirun"} & set(argv) and any(re.match(r"\+*tune=", a) for a in argv):
        print("rlrun: error: tune: a Tune population runs without -m (its trials are Tune's)", file=sys.stderr)
        return 2
    problem = check_group_choices(argv)
    if problem:
        print(f"rlrun: error: {problem}", file=sys.stderr)
        return 2
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM = Ctrl-C: final checkpoint, run KILLED (exit 143)
    user_wants_trace = bool(os.environ.get("HYDRA_FULL_ERROR"))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors instead of printing them: we say them in one line
    if user_wants_trace:
        os.environ["RLRUN_TRACEBACK"] = "1"  # and a plugin's own bug shows its traceback
    try:
        _main()
    except Exception as e:
        from rlrun.app.cli_errors import hydra_error_line

        line = None if user_wants_trace else hydra_error_line(e, [a for a in sys.argv[1:] if not a.startswith("-")])
        if line is None:
            raise
        print(f"rlrun: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM during a sweep (a single run exits inside _main)
        end_interrupted_sweep()
        print("rlrun: sweep interrupted; the running job's run and the sweep's parent run are marked KILLED",
              file=sys.stderr)
        return 143 if is_sigterm(e) else 130
    if OUTCOME.failed:
        print(f"rlrun: {len(OUTCOME.failed)} of {OUTCOME.total} jobs failed: {', '.join(OUTCOME.failed)}",
              file=sys.stderr)
        if len(OUTCOME.failed) == OUTCOME.total:
            return 1
    return 0


if __name__ == "__main__":
    main()
