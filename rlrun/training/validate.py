"""The one config validator: plain data -> a checked ``RunConfig``, before any env, model or Ray starts.

Hydra composes YAML into a DictConfig; ``rlrun/app/compose.py`` resolves it to plain data and calls
``build_config``, which returns a ``RunConfig`` of dataclasses (schemas: ``rlrun/config/``) or raises
``ConfigError`` with one message naming the key and the offending value. The algo, loss and model
sections are checked against the schema that their *registry entry* declares, so a plugin's algo or
loss brings its own schema and gets the same checks as the built-in ones. The generic key/type
checking lives in ``rlrun/config/typed.py``. It sits in the training layer because the cross checks
ask the layers below (env ids and spaces, wrappers, optimizers, algorithms' columns).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from rlrun.config.domains import check_domains, check_memory
from rlrun.config.multi_agent import check_multi_agent_config, learned_policies
from rlrun.config.offline import MINARI, OPE_FIELDS, SAMPLER, check_offline_config, parse_input
from rlrun.config.resources import check_resources
from rlrun.config.schemas import (
    AlgoConfig,
    LossConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
)
from rlrun.config.serving import check_server_config
from rlrun.config.typed import ConfigError, from_dict, show
from rlrun.core.errors import suggest
from rlrun.core.metrics import STOP_COUNTERS, reported_metrics, seat_metric
from rlrun.core.registry import ALGOS, CALLBACKS, ENVS, LOSSES, MODELS, RegistryError
from rlrun.core.sweep_info import TARGET_OBJECTIVES
from rlrun.models import gemm
from rlrun.sources.plugins import load_builtins


# --------------------------------------------------------------------------- build + cross checks
def _schema(registry: Any, section: dict[str, Any], key: str, default_cls: type) -> type:
    name = section.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"{key}.name: expected a registered {registry.kind} name, got {show(name)}")
    try:
        cls = registry.entry(name, f"{key}.name").config_cls
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    return cls or default_cls


def build_config(raw: dict[str, Any], for_run: bool = True) -> RunConfig:
    """Validate plain config data (a resolved Hydra config) into a ``RunConfig``. ``for_run=False``:
    the config of a run that is not started here (a checkpoint's, loaded to evaluate or export it; a
    policy server's): what this machine can hold is not checked.

    Raises ``ConfigError`` naming the key and the value for: unknown keys, wrong types, unknown
    registry names, unknown stop keys, impossible batch arithmetic and algo/loss mismatches.
    Registries must already hold plugins (``registry.load_plugins``).
    """
    load_builtins()  # the names below are checked against the registries (user plugins: the caller's)
    raw = dict(raw)
    sections: dict[str, Any] = {}
    for key, registry, base in (("algo", ALGOS, AlgoConfig), ("loss", LOSSES, LossConfig),
                                ("model", MODELS, ModelConfig)):
        section = raw.pop(key, None)
        if section is None:  # the schema's defaults; the loss follows the algorithm
            section = {"name": _default_loss(sections["algo"].name) if key == "loss" else base().name}
        if not isinstance(section, dict):
            raise ConfigError(f"{key}: expected a mapping with a 'name', got {show(section)}")
        sections[key] = from_dict(_schema(registry, section, key, base), section, key)
    if "stop" in raw:
        raw["stop"] = normalize_stop(raw["stop"])
    cfg: RunConfig = from_dict(RunConfig, {**raw, **sections}, "")
    return check_config(cfg, for_run)


def _default_loss(algo_name: str) -> str:
    return str(ALGOS.get(algo_name, "algo.name").default_loss)


def normalize_stop(stop: Any) -> dict[str, float]:
    """Flatten ``{rollout: {episode_return_mean: 475}}`` to ``{"rollout/episode_return_mean": 475}``.

    Both spellings are accepted so that ``+stop.rollout.episode_return_mean=400`` works from the
    command line (Hydra's override grammar has no ``/`` in keys).
    """
    out: dict[str, float] = {}

    def walk(prefix: str, node: Any) -> None:
        for k, v in node.items():
            name = f"{prefix}/{k}" if prefix else str(k)
            if isinstance(v, dict):
                walk(name, v)
            elif v is None:
                continue  # `stop.timesteps_total=null` removes a criterion
            elif isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"stop.{name}: expected a number, got {show(v)}")
            elif name in out and out[name] != v:
                raise ConfigError(
                    f"stop.{name}: given twice with different values ({out[name]:g} and {v:g}); to change a "
                    f"threshold set in YAML use '++stop={{{name}: {v:g}}}'"
                )
            else:
                out[name] = float(v)

    if not isinstance(stop, dict):
        raise ConfigError(f"stop: expected a mapping of criteria, got {show(stop)}")
    walk("", stop)
    return out


def check_config(cfg: RunConfig, for_run: bool = True) -> RunConfig:
    """Cross-field checks that need registries: names, stop keys, batch arithmetic, algo/loss fit,
    value ranges. Returns the config with ``auto`` rollout sizes resolved (``cfg`` is not changed)."""
    check_domains(cfg)
    _check_run_values(cfg)
    _check_extras(cfg)
    if for_run:
        check_resources(cfg)  # sizes this machine cannot hold, named by the key the user set
    cfg = replace(cfg, rollout=resolve_auto_sizes(cfg.rollout, cfg.algo.train_batch_size))
    for check in (_check_names, _check_stop, _check_batch_arithmetic, _check_algo_values, _check_optimizer,
                  _check_plugin_rules, _check_recurrent, check_multi_agent_config, _check_minari_output,
                  check_offline_config, check_server_config):
        check(cfg)
    r = cfg.rollout
    check_memory(cfg.algo.train_batch_size, int(r.num_envs_per_worker), int(r.rollout_fragment_length))
    return cfg


def _check_extras(cfg: RunConfig) -> None:
    """What this run needs beyond the core install (Ray workers, the policy server, Minari data) is
    installed: else one line naming the extra, before anything starts."""
    from rlrun.config.extras import require

    r = cfg.rollout
    if r.num_workers > 0:
        require("ray", f"rollout.num_workers={r.num_workers} (Ray workers)")
    elif r.ray.address is not None:
        require("ray", f"rollout.ray.address={r.ray.address}")
    if r.server is not None:
        require("uvicorn", "rollout=server (the policy server)")
    for key, value in (("input", cfg.input), ("output", cfg.output)):
        if isinstance(value, str) and value.startswith(MINARI):
            require("minari", f"{key}={value}")


def _check_minari_output(cfg: RunConfig) -> None:
    """``output: minari:<id>``: a well-formed id that no local dataset has yet (before the other output
    checks; a multi-agent run's Minari output is refused by ``check_offline_config``)."""
    if cfg.output is not None and cfg.output.startswith(MINARI) and not cfg.multiagent.policies:
        from rlrun.data.minari import check_output

        check_output(cfg.output)


def _check_names(cfg: RunConfig) -> None:
    from rlrun.envs.envpool import check_envpool_id
    from rlrun.envs.make import check_env_config, check_env_id

    algo = ALGOS.get(cfg.algo.name)
    loss = LOSSES.entry(cfg.loss.name)
    from rlrun.envs.wrappers import parse_wrappers

    try:
        if cfg.env.id is not None and cfg.env.vectorize == "envpool" and cfg.env.id not in ENVS:
            check_envpool_id(cfg.env.id)
        elif cfg.env.id is not None:
            check_env_id(cfg.env.id)
        parse_wrappers(cfg.env.wrappers)
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    check_env_config(cfg)
    for i, name in enumerate(cfg.callbacks):
        try:
            CALLBACKS.entry(name, f"callbacks[{i}]")
        except RegistryError as e:
            raise ConfigError(str(e)) from None
    provided = set(algo.provides_columns)  # the loss needs columns that the algo's postprocessing produces
    missing = [c for c in loss.info.get("requires", ()) if c not in provided]
    if missing:
        raise ConfigError(
            f"loss.name: loss '{cfg.loss.name}' needs batch columns {missing} that algo "
            f"'{cfg.algo.name}' does not produce (it produces {sorted(provided)}). "
            f"Pick a loss made for '{cfg.algo.name}', e.g. loss={algo.default_loss}"
        )


def known_stop_keys(cfg: RunConfig) -> list[str]:
    """Counters plus every metric this run reports (its algo's and its loss's included)."""
    algo = ALGOS.get(cfg.algo.name)
    loss = LOSSES.entry(cfg.loss.name)
    ma = cfg.multiagent
    learned = learned_policies(cfg)
    metrics = reported_metrics(algo.metrics, loss.info.get("terms", ()), loss.info.get("stats", ()), ma.policies,
                               learned)
    ope = [f"ope/{m}/{k}" for m in cfg.offline.evaluation for k in OPE_FIELDS]
    return sorted({*STOP_COUNTERS, *metrics, *ope})


def _check_stop(cfg: RunConfig) -> None:
    if not cfg.stop:
        raise ConfigError(f"stop: no stop criterion; set at least one of {', '.join(STOP_COUNTERS)}")
    known = known_stop_keys(cfg)
    for key, value in cfg.stop.items():
        if key not in known and not _named_at_run_time(cfg, key):
            raise ConfigError(
                f"stop.{key}: '{key}' is not a metric rlrun reports for algo '{cfg.algo.name}'"
                f"{suggest(key, known)}. Stop keys: {', '.join(known)}"
            )
        if math.isnan(value) or (key in STOP_COUNTERS and not math.isfinite(value)):
            raise ConfigError(f"stop.{key}: must be a finite number, got {value!r}")
        if key in STOP_COUNTERS and value <= 0:
            raise ConfigError(f"stop.{key}: must be positive, got {value:g}")
    objective = cfg.objective
    if objective not in known and objective not in TARGET_OBJECTIVES and not _named_at_run_time(cfg, objective):
        raise ConfigError(f"objective: '{objective}' is not a metric rlrun reports for algo '{cfg.algo.name}'"
                          f"{suggest(objective, known)} (or steps_to_target, time_to_target)")


def _named_at_run_time(cfg: RunConfig, key: str) -> bool:
    """``custom/<name>_mean|_min|_max``: what callbacks report (names known only at run time); with
    ``env.shuffle_seats``, a policy's evaluation return in one seat (the seats, the env's agents, are
    checked against the env by ``map_agents``)."""
    seat = seat_metric(key)
    if seat is not None:
        return cfg.env.shuffle_seats and seat[0] in cfg.multiagent.policies
    return bool(cfg.callbacks) and key.startswith("custom/") and key.endswith(("_mean", "_min", "_max"))


def _check_batch_arithmetic(cfg: RunConfig) -> None:
    r, a = cfg.rollout, cfg.algo
    if parse_input(cfg.input) != [(SAMPLER, 1.0)]:  # rows read from files (a mix's sampled share varies by round)
        return
    workers = max(r.num_workers, 1)
    for key in ("rollout_fragment_length", "num_envs_per_worker"):
        if int(getattr(r, key)) < 1:
            raise ConfigError(f"rollout.{key}: must be at least 1, got {getattr(r, key)}")
    round_size = int(r.rollout_fragment_length) * int(r.num_envs_per_worker) * workers
    formula = (f"rollout_fragment_length x num_envs_per_worker x max(num_workers, 1) = "
               f"{r.rollout_fragment_length} x {r.num_envs_per_worker} x {workers} = {round_size}")
    if a.train_batch_size % round_size:
        lo = a.train_batch_size // round_size * round_size
        fits = " or ".join(str(x) for x in (lo, lo + round_size) if x > 0)
        hints = [f"algo.train_batch_size={fits}"]
        for key, other in (("rollout_fragment_length", r.num_envs_per_worker),
                           ("num_envs_per_worker", r.rollout_fragment_length)):
            if a.train_batch_size % (int(other) * workers) == 0:  # "auto" sizes this one to the batch
                hints.append(f"rollout.{key}=auto (= {a.train_batch_size // (int(other) * workers)})")
        raise ConfigError(
            f"algo.train_batch_size: {a.train_batch_size} is not a multiple of one sampling round, {formula}; "
            f"use {' or '.join(hints)}"
        )
    mb = a.sgd_minibatch_size
    # replay-based algorithms (DQN, SAC, TD3) draw minibatches from the buffer, not from the train batch
    capacity = getattr(a, "replay_capacity", None)
    bound, name = ((capacity, "replay_capacity") if isinstance(capacity, int)
                   else (a.train_batch_size, "train_batch_size"))
    if mb is not None and not 1 <= mb <= bound:
        raise ConfigError(f"algo.sgd_minibatch_size: {mb} must be between 1 and algo.{name}={bound}")


def _check_algo_values(cfg: RunConfig) -> None:
    """Each value's range (``lr``, ``gamma``, a schedule's pairs) is ``DOMAINS``' (``check_domains``, run
    first); here, what no single value shows: a schedule that would override its value silently."""
    for key in ("training_intensity", "lr"):
        _check_schedule_start(cfg.algo, key)


def _check_schedule_start(a: Any, key: str) -> None:
    """``algo.<key>_schedule`` from env step 0 replaces ``algo.<key>``: a value that differs from the
    schedule's start (an override of the value alone, say) would have no effect, silently."""
    sched = getattr(a, f"{key}_schedule", None)
    value = getattr(a, key, None)
    if sched and value is not None and sched[0][0] <= 0 and sched[0][1] != value:
        raise ConfigError(
            f"algo.{key}: {value:g} has no effect because algo.{key}_schedule starts at {sched[0][1]:g}; "
            f"start the schedule at ${{algo.{key}}} (as the presets do), change it, or set algo.{key}_schedule=null"
        )


def _check_recurrent(cfg: RunConfig) -> None:
    if MODELS.entry(cfg.model.name).info.get("recurrent") and not getattr(ALGOS.get(cfg.algo.name), "recurrent", False):
        able = [n for n in ALGOS.names() if getattr(ALGOS.get(n), "recurrent", False)]
        raise ConfigError(f"model.name: '{cfg.model.name}' is a recurrent model, and algo '{cfg.algo.name}' cannot "
                          f"carry its state through its data path; recurrent models train with {', '.join(able)}")


def _check_plugin_rules(cfg: RunConfig) -> None:
    """Checks a registry entry brings along (``validate=`` at registration): e.g. a model's activation."""
    for key, registry, section in (("algo", ALGOS, cfg.algo), ("loss", LOSSES, cfg.loss), ("model", MODELS, cfg.model)):
        validate = registry.entry(section.name).info.get("validate")
        if validate is None:
            continue
        problem = validate(section)
        if problem:
            raise ConfigError(f"{key}.{problem}")


def _check_optimizer(cfg: RunConfig) -> None:
    from rlrun.policy.optim import check_optimizer_kwargs

    try:
        check_optimizer_kwargs(cfg.algo.optimizer.name, cfg.algo.optimizer.kwargs)
    except RegistryError as e:
        raise ConfigError(str(e)) from None


MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's values


def _choice(key: str, value: str, known: tuple[str, ...]) -> tuple[bool, str]:
    """A ``_check_run_values`` check that ``value`` (config key ``key``) is one of ``known``."""
    return value in known, f"{key}: unknown '{value}'{suggest(str(value), known)}; known: {', '.join(known)}"


def _check_run_values(cfg: RunConfig) -> None:
    r = cfg.rollout
    checks = [
        (cfg.algo.train_batch_size >= 1, f"algo.train_batch_size: must be at least 1, got {cfg.algo.train_batch_size}"),
        (r.num_workers >= 0, f"rollout.num_workers: must be 0 (in-process) or more, got {r.num_workers}"),
        (r.num_cpus_per_worker > 0, f"rollout.num_cpus_per_worker: must be positive, got {r.num_cpus_per_worker:g}"),
        (r.max_worker_restarts >= 0, f"rollout.max_worker_restarts: must be 0 or more, got {r.max_worker_restarts}"),
        (cfg.checkpoint.every_n_iters >= 0 and cfg.checkpoint.keep_last >= 1,
         f"checkpoint: every_n_iters must be >= 0 and keep_last >= 1, got every_n_iters="
         f"{cfg.checkpoint.every_n_iters}, keep_last={cfg.checkpoint.keep_last}"),
        (cfg.evaluation.interval >= 0 and cfg.evaluation.num_episodes >= 1 and cfg.evaluation.num_envs >= 1,
         f"evaluation: interval must be >= 0, num_episodes and num_envs >= 1; got interval={cfg.evaluation.interval}, "
         f"num_episodes={cfg.evaluation.num_episodes}, num_envs={cfg.evaluation.num_envs}"),
        (cfg.torch_threads >= 1, f"torch_threads: must be at least 1, got {cfg.torch_threads}"),
        _choice("torch_matmul_precision", cfg.torch_matmul_precision, MATMUL_PRECISIONS),
        _choice("torch_matmul_backend", cfg.torch_matmul_backend, gemm.BACKENDS),
        (r.observation_filter_clip > 0, f"rollout.observation_filter_clip: must be positive, got "
                                        f"{r.observation_filter_clip:g}"),
        (r.ray.num_cpus is None or r.ray.num_cpus >= 1,
         f"rollout.ray.num_cpus: must be at least 1 or null, got {r.ray.num_cpus}"),
        (r.ray.num_cpus is None or r.ray.address is None,
         f"rollout.ray.num_cpus: {r.ray.num_cpus} sizes a private Ray instance, but rollout.ray.address="
         f"'{r.ray.address}' joins an existing cluster; set one of them to null"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def resolve_auto_sizes(r: RolloutConfig, train_batch_size: int) -> RolloutConfig:
    """A copy of ``r`` with ``auto`` in num_envs_per_worker or rollout_fragment_length replaced so that
    one sampling round, fragment x envs x max(workers, 1), is exactly ``train_batch_size``."""
    frag, envs = r.rollout_fragment_length, r.num_envs_per_worker
    workers = max(r.num_workers, 1)
    if frag == "auto" and envs == "auto":
        raise ConfigError("rollout.rollout_fragment_length and rollout.num_envs_per_worker are both 'auto'; "
                          "set one of them to a number")
    for key, other_key, other in (("rollout_fragment_length", "num_envs_per_worker", envs),
                                  ("num_envs_per_worker", "rollout_fragment_length", frag)):
        if getattr(r, key) != "auto":
            continue
        assert isinstance(other, int)
        per = other * workers
        if other < 1 or train_batch_size % per:
            raise ConfigError(
                f"rollout.{key}: 'auto' needs algo.train_batch_size ({train_batch_size}) to be a multiple of "
                f"{other_key} x max(num_workers, 1) = {other} x {workers} = {per}"
            )
        size = train_batch_size // per
        return replace(r, rollout_fragment_length=size) if key == "rollout_fragment_length" \
            else replace(r, num_envs_per_worker=size)
    return r
