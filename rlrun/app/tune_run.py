"""``rlrun +experiment=<preset> tune=pbt``: a population of trials with Ray Tune, from YAML.

The composed rlrun config is every trial's base; the ``tune`` section (``rlrun/conf/tune/*.yaml``) says
how many trials, the scheduler (``pbt``: Tune's ``PopulationBasedTraining``; ``asha``: its asynchronous
successive halving, ``ASHAScheduler``; ``fifo``: none) and which rlrun keys it samples (``param_space``)
and mutates (``hyperparam_mutations``). Each trial is an
``RLrunTrainable`` (rlrun/app/tune_trainable.py) in its own MLflow run of the preset's experiment,
stopped by the preset's ``stop``. Values: a list is a choice (for PBT's mutations: the values it
steps between), ``{uniform: [lo, hi]}``, ``{loguniform: [lo, hi]}``, ``{randint: [lo, hi]}``,
``{grid: [a, b, ...]}`` (every value, ``num_samples`` times each: Tune's ``grid_search``), or a plain value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlrun.config.resources import MAX_TRIAL_CPUS
from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError, to_dict
from rlrun.core.errors import suggest


@dataclasses.dataclass(frozen=True)
class TuneSection:
    """The ``tune`` section of a config (``rlrun/conf/tune/pbt.yaml`` documents each key)."""

    num_samples: int = 4
    scheduler: str = "pbt"
    metric: str = "rollout/episode_return_mean"
    mode: str = "max"
    time_attr: str = "timesteps_total"
    perturbation_interval: float = 20000
    burn_in_period: float = 0
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    synch: bool = False  # pbt: every trial waits at each perturbation, then the bottom takes the top's checkpoints
    max_t: float = 100_000  # asha: no trial trains past this many time_attr units
    grace_period: float = 10_000  # asha: every trial trains at least this long before it can be stopped
    reduction_factor: float = 2  # asha: at each rung the top 1/reduction_factor of the trials go on
    hyperparam_mutations: dict[str, Any] = dataclasses.field(default_factory=dict)
    param_space: dict[str, Any] = dataclasses.field(default_factory=dict)
    cpus_per_trial: float | None = None  # null: the CPUs shared so that every trial runs at once (at most 1)
    max_concurrent_trials: int | None = None  # null: as many as the CPUs allow
    num_cpus: int | None = None  # the local Ray instance's CPUs (null: this machine's)
    storage_path: str | None = None  # null: <the run's output dir>/tune
    name: str | None = None  # the Tune experiment (null: the rlrun experiment's name)
    time_share: bool | None = None  # async pbt: pause a trial at its perturbation while another waits (null: only
    #                                  when the trials cannot all run at once)


SCHEDULERS = ("pbt", "asha", "fifo")
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "grid")


def parse_section(raw: Mapping[str, Any]) -> TuneSection:
    """The ``tune`` section checked key by key (one line naming the key and value)."""
    fields = {f.name: f for f in dataclasses.fields(TuneSection)}
    for key in raw:
        if key not in fields:
            raise ConfigError(f"tune.{key}: not a tune key{suggest(str(key), list(fields))}; "
                              f"tune keys: {', '.join(fields)}")
    values = {k: v for k, v in raw.items() if v is not None or (k in fields and fields[k].default is None)}
    for key in ("hyperparam_mutations", "param_space"):
        if not isinstance(values.get(key, {}), Mapping):
            raise ConfigError(f"tune.{key}: expected a mapping of rlrun keys to values, got {values[key]!r}")
        values[key] = _flat(values.get(key) or {})
    section = TuneSection(**values)
    if not isinstance(section.num_samples, int) or section.num_samples < 1:
        raise ConfigError(f"tune.num_samples: expected a whole number >= 1, got {section.num_samples!r}")
    if section.scheduler not in SCHEDULERS:
        raise ConfigError(f"tune.scheduler: {section.scheduler!r} is not one rlrun has"
                          f"{suggest(str(section.scheduler), list(SCHEDULERS))}; choose {', '.join(SCHEDULERS)}")
    if section.cpus_per_trial is not None and not (isinstance(section.cpus_per_trial, int | float)
                                                   and 0 < section.cpus_per_trial <= MAX_TRIAL_CPUS):
        raise ConfigError(f"tune.cpus_per_trial: expected a number in (0, {MAX_TRIAL_CPUS}], "
                          f"got {section.cpus_per_trial!r}")
    for key in ("synch", "time_share"):
        value = getattr(section, key)
        if not isinstance(value, bool) and not (key == "time_share" and value is None):
            raise ConfigError(f"tune.{key}: expected true or false{' or null' if key == 'time_share' else ''}, "
                              f"got {value!r}")
    if section.mode not in ("max", "min"):
        raise ConfigError(f"tune.mode: expected max or min, got {section.mode!r}")
    for key in ("perturbation_interval", "burn_in_period", "quantile_fraction", "resample_probability", "max_t",
                "grace_period", "reduction_factor"):
        value = getattr(section, key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0 or not math.isfinite(value):
            raise ConfigError(f"tune.{key}: expected a number >= 0, got {value!r}")
    if section.scheduler == "asha" and not (0 < section.grace_period <= section.max_t and section.reduction_factor > 1):
        raise ConfigError(f"tune: ASHA needs 0 < grace_period <= max_t and reduction_factor > 1, got "
                          f"grace_period={section.grace_period:g}, max_t={section.max_t:g}, "
                          f"reduction_factor={section.reduction_factor:g}")
    if section.scheduler == "pbt" and not section.hyperparam_mutations:
        raise ConfigError("tune.hyperparam_mutations: PBT needs at least one rlrun key to mutate, "
                          "e.g. {algo.lr: [1.0e-4, 3.0e-4, 1.0e-3]}")
    return section


def _flat(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{algo: {lr: [...]}}`` and ``{algo.lr: [...]}`` alike -> ``{"algo.lr": [...]}`` (a range such as
    ``{uniform: [lo, hi]}`` is a value, not a section)."""
    out: dict[str, Any] = {}
    for k, v in spec.items():
        if isinstance(v, Mapping) and not (len(v) == 1 and next(iter(v)) in DISTRIBUTIONS):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _check_key(base: Mapping[str, Any], key: str, where: str) -> None:
    node: Any = base
    parts = str(key).split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping) or part not in node:
            known = list(node) if isinstance(node, Mapping) else []
            raise ConfigError(f"{where}.{key}: {'.'.join(parts[:i + 1])} is not a key of the rlrun config"
                              f"{suggest(part, known)}")
        node = node[part]


def _value(spec: Any, where: str, mutation: bool = False) -> Any:
    """A YAML value -> what Tune takes (a list: a choice; for a mutation the list itself)."""
    from ray import tune

    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: an empty list of values")
        return list(spec) if mutation else tune.choice(list(spec))
    if isinstance(spec, Mapping):
        if len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
            raise ConfigError(f"{where}: expected a list of values or one of {{{', '.join(DISTRIBUTIONS)}: [lo, hi]}}, "
                              f"got {dict(spec)!r}")
        kind, bounds = next(iter(spec.items()))
        if kind == "grid":
            if mutation or not (isinstance(bounds, list) and bounds):
                raise ConfigError(f"{where}: grid takes a non-empty list of values, and only in tune.param_space; "
                                  f"got {bounds!r}")
            return tune.grid_search(list(bounds))
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int | float) for b in bounds)
                and bounds[0] < bounds[1] and (kind != "loguniform" or bounds[0] > 0)):
            extra = " and lo > 0" if kind == "loguniform" else ""
            raise ConfigError(f"{where}: {kind} needs [lo, hi] with lo < hi{extra}, got {bounds!r}")
        return getattr(tune, kind)(*bounds)
    if mutation:
        raise ConfigError(f"{where}: expected a list of values or {{uniform|loguniform|randint: [lo, hi]}}, "
                          f"got {spec!r}")
    return spec


def _first(spec: Any) -> Any:
    if isinstance(spec, list) and spec:
        return spec[0]
    if isinstance(spec, Mapping) and len(spec) == 1 and isinstance(next(iter(spec.values())), list):
        bounds = next(iter(spec.values()))
        return bounds[0] if bounds else None
    return spec


def _trial_base(cfg: RunConfig, unresolved: Any, section: TuneSection, launch: Path) -> dict[str, Any]:
    """Every trial's base config (plain, unresolved), its tuned keys and one trial's values checked
    here: a bad key or value is one line before Ray starts."""
    if not isinstance(unresolved, dict):
        raise ConfigError(f"tune: expected a mapping config, got {type(unresolved).__name__}")
    base = {str(k): v for k, v in unresolved.items() if k != "hydra"}
    full = to_dict(cfg)  # every key, defaults included
    for key in [*section.hyperparam_mutations, *section.param_space]:
        where = "tune.hyperparam_mutations" if key in section.hyperparam_mutations else "tune.param_space"
        _check_key(full, key, where)
    from rlrun.app.tune_trainable import config_with

    firsts = {k: _first(v) for k, v in {**section.hyperparam_mutations, **section.param_space}.items()}
    try:
        config_with(base, firsts, launch)
    except ConfigError as e:
        raise ConfigError(f"tune: a trial with {', '.join(f'{k}={v!r}' for k, v in firsts.items())}: {e}") from None
    from rlrun.tracking.tracker import store_locations

    uri, artifacts = store_locations(cfg.tracking.tracking_uri, cfg.tracking.artifact_location, launch)
    base["tracking"] = {**base["tracking"], "tracking_uri": uri, "artifact_location": artifacts}
    base["output_dir"] = None  # each trial's: its Tune trial dir
    base["experiment"] = cfg.experiment  # the preset's name, as the CLI gives it (one MLflow experiment)
    return base


def _scheduler(section: TuneSection) -> Any:
    """Tune's scheduler for the section (None: fifo)."""
    if section.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(time_attr=section.time_attr, max_t=int(section.max_t),
                             grace_period=int(section.grace_period), reduction_factor=section.reduction_factor)
    if section.scheduler != "pbt":
        return None
    from rlrun.app.tune_pbt import SynchronousPBT  # Tune's PopulationBasedTraining, its synch mode without hangs

    mutations = {k: _value(v, f"tune.hyperparam_mutations.{k}", True) for k, v in section.hyperparam_mutations.items()}
    return SynchronousPBT(
        time_attr=section.time_attr, perturbation_interval=section.perturbation_interval,
        burn_in_period=section.burn_in_period, hyperparam_mutations=mutations,
        quantile_fraction=section.quantile_fraction, resample_probability=section.resample_probability,
        synch=section.synch)  # its time_share is set in run_tune, where the CPUs are known


def _space(section: TuneSection) -> dict[str, Any]:
    """The values Tune draws once per trial: ``param_space``'s, and for fifo and asha also the mutated keys'
    (PBT draws a trial's first value of each key it mutates; the others draw it the same way and keep it, so
    ``tune=pbt tune.scheduler=fifo`` trains PBT's starting population without exploits)."""
    space = {k: _value(v, f"tune.param_space.{k}") for k, v in section.param_space.items()}
    if section.scheduler != "pbt":
        space.update({k: _value(v, f"tune.hyperparam_mutations.{k}") for k, v in section.hyperparam_mutations.items()
                      if k not in space})
    return space


def _stopped_by_scheduler(metrics: Mapping[str, Any]) -> bool:
    """A trial's last result says it ended (Tune marks it ``done`` when the scheduler stops it, too) but not
    by its own ``stop`` (the trainable's ``stop_reason``)."""
    return bool(metrics.get("done")) and not metrics.get("stop_reason")


def run_tune(cfg: RunConfig, unresolved: Any, raw_section: Mapping[str, Any], launch: Path,
             output_dir: str | None) -> int:
    """Run the population of ``cfg`` (the validated base; ``unresolved``: its plain data before
    interpolation, what each trial resolves with its values); print each trial's outcome; the exit
    status (1 if a trial failed)."""
    section = parse_section(raw_section)
    base = _trial_base(cfg, unresolved, section, launch)
    scheduler = _scheduler(section)
    space = _space(section)
    name = section.name or cfg.experiment or cfg.algo.name
    storage = Path(section.storage_path or Path(output_dir or launch) / "tune").resolve()
    import ray
    from ray import tune

    from rlrun.app.tune_pbt import SynchronousPBT
    from rlrun.app.tune_trainable import RLrunTrainable
    from rlrun.sources.ray_instance import init_ray, shutdown_ray

    # a private local instance on 127.0.0.1 (or rollout.ray.address's cluster), stopped at the end
    started = init_ray(dataclasses.replace(cfg.rollout.ray, num_cpus=section.num_cpus or cfg.rollout.ray.num_cpus),
                       launch)
    # Tune's table of the trials with the tuned keys as columns (its newer output prints every trial's whole config)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    reporter = tune.CLIReporter(
        parameter_columns=[*section.hyperparam_mutations, *section.param_space],
        metric_columns={section.metric: section.metric.rsplit("/", 1)[-1], "timesteps_total": "env steps",
                        "training_iteration": "iter"}, max_report_frequency=30)
    try:
        grid = math.prod(len(v["grid"]) for v in section.param_space.values() if isinstance(v, Mapping) and "grid" in v)
        print(f"rlrun: {section.num_samples * grid} trials ({section.scheduler}) of {name}; MLflow experiment "
              f"'{cfg.tracking.experiment_name or cfg.experiment or 'Default'}' at {base['tracking']['tracking_uri']}; "
              f"Tune's files in "
              f"{storage / name}", flush=True)
        # every trial at once by default (a trial waiting for CPUs is paused and restarted at each perturbation), and
        # then only its own exploit pauses a trial (tune.time_share). Each restart starts the trial's actor again
        # (seconds of imports): Tune's reuse_actors was measured (experiments/tune_pbt, 2026-12-08) and is not used:
        # no faster (1.02-1.12x), and its trials' curves had gaps and fewer of them met the target
        total = ray.available_resources().get("CPU", 1.0)
        cpus = section.cpus_per_trial or min(1.0, total / section.num_samples)
        if isinstance(scheduler, SynchronousPBT):
            # PBT's time sharing (null) only where the trials take turns: not when every one gets its CPUs at once
            n = section.num_samples
            all_at_once = cpus * n <= total + 1e-9 and (section.max_concurrent_trials or n) >= n
            scheduler.time_share = not all_at_once if section.time_share is None else section.time_share
        tuner = tune.Tuner(
            tune.with_resources(RLrunTrainable, {"cpu": cpus}), param_space={"rlrun": base, **space},
            tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=section.num_samples, metric=section.metric,
                                        mode=section.mode, max_concurrent_trials=section.max_concurrent_trials),
            run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=1, progress_reporter=reporter,
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True)))
        results = tuner.fit()
    finally:
        if started:
            shutdown_ray()
    code = _report(results, section)
    cut = _mark_interrupted(results, base["tracking"]["tracking_uri"], storage / name, section.time_attr)
    return 130 if cut else code


def _report(results: Any, section: TuneSection) -> int:
    failed = 0
    for r in results:
        m = r.metrics or {}
        trial = m.get("trial_id", "?")
        value = m.get(section.metric, float("nan"))
        if r.error is not None:
            failed += 1
            print(f"rlrun: trial {trial}: failed: {str(r.error).splitlines()[-1][:300]}", flush=True)
        else:
            by = f" (stopped by {section.scheduler})" if _stopped_by_scheduler(m) else ""
            print(f"rlrun: trial {trial}: {section.metric} = {value:g} after {int(m.get('timesteps_total', 0)):,} "
                  f"env steps, {m.get('training_iteration', 0)} iterations{by}", flush=True)
    try:
        best = results.get_best_result()
        print(f"rlrun: best trial {best.metrics.get('trial_id')}: {section.metric} = "
              f"{best.metrics.get(section.metric, float('nan')):g}", flush=True)
    except (RuntimeError, ValueError):
        pass
    return 1 if failed else 0


def _mark_interrupted(results: Any, tracking_uri: str, where: Path, time_attr: str) -> bool:
    """Each trial's MLflow run in the state the trial ended in: after Ctrl-C (Tune stops the trials and saves
    its state) the trials that had not ended are marked KILLED (their last checkpoints are Tune's); a trial
    that met its stop, or that the scheduler stopped (ASHA: ``rlrun.stop_reason`` says when), is FINISHED (an actor
    of it that Tune killed at the end may have left its run open). True if any trial was cut short."""
    # a trial ends on its own stop or the scheduler's (its last result is `done`), or an error; any other was cut short
    last = {str((r.metrics or {}).get("trial_id")): r.metrics or {} for r in results if r.error is None}
    done = {trial: bool(m.get("done")) for trial, m in last.items()}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    for trial, ended in done.items():
        for run in client.search_runs(ids, f"tags.`rlrun.tune.trial_id` = '{trial}'"):
            if not ended:
                client.set_tag(run.info.run_id, "rlrun.stop_reason", "interrupted (Ctrl-C): Tune saved its state")
                client.set_terminated(run.info.run_id, "KILLED")
                continue
            if _stopped_by_scheduler(last[trial]):
                client.set_tag(run.info.run_id, "rlrun.stop_reason",
                               f"stopped by the Tune scheduler at {time_attr} = {last[trial].get(time_attr, 0):g}")
            if run.info.status == "RUNNING":
                client.set_terminated(run.info.run_id, "FINISHED")
    cut = [trial for trial, ended in done.items() if not ended]
    if not cut:
        return False
    print(f"rlrun: interrupted: {len(cut)} trials had not ended (MLflow runs marked KILLED); Tune's state and "
          f"their checkpoints are in {where} (tune.Tuner.restore)", file=sys.stderr, flush=True)
    return True

