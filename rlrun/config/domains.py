"""The real domain of every numeric config value, checked before anything runs.

Rules are keyed by field name, so they apply in every section that has the field, plugin schemas
included (a plugin's ``lr`` must be positive too). Every float must be finite unless its rule says
otherwise: ``nan``, ``inf`` and ``1e400`` never reach a run. ``check_domains`` walks a dataclass
tree and raises ``ConfigError`` naming the dotted key and the value.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

from rlrun.config.typed import ConfigError

Rule = Callable[[Any], str | None]  # value -> what is wrong with it, or None


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be positive"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def unit_interval(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be in [0, 1]"


def at_least(n: int) -> Rule:
    return lambda v: None if v >= n else f"must be at least {n}"


def between(lo: float, hi: float) -> Rule:
    return lambda v: None if lo <= v <= hi else f"must be between {_fmt(lo)} and {_fmt(hi)}"


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def each(rule: Rule) -> Rule:
    """A rule for every element of a list."""

    def check(v: Any) -> str | None:
        for i, x in enumerate(v):
            problem = rule(x)
            if problem:
                return f"element {i} ({x!r}) {problem}"
        return None

    return check


def schedule(lo: float = 0.0, hi: float = math.inf, *, positive: bool = False) -> Rule:
    """``[[env_step, value], ...]``: pairs, increasing steps >= 0, values in [lo, hi] (``positive``: > 0)."""

    def check(v: Any) -> str | None:
        if not v or any(not isinstance(p, list | tuple) or len(p) != 2 for p in v):
            return "expected [[env_step, value], ...] with at least one pair"
        steps = [p[0] for p in v]
        if steps != sorted(steps) or steps[0] < 0:
            return "env steps must start at >= 0 and increase"
        if positive and any(not p[1] > 0 for p in v):
            return "values must be positive"
        if any(not lo <= p[1] <= hi for p in v):
            return f"values must be in [{lo:g}, {hi:g}]"
        return None

    return check


# rlrun adds offsets to the seed (1000 x worker + sub-env, 1,000,003 x restarts, 10,000,019 for evaluation);
# 2**31 - 1 leaves room for them below the 2**32 that some seeders (torch's, gymnasium's spaces) accept
MAX_SEED = 2**31 - 1

DOMAINS: dict[str, Rule] = {
    # algo
    "lr": positive, "gamma": unit_interval, "gae_lambda": unit_interval, "grad_clip": positive,
    "adam_eps": positive, "train_batch_size": at_least(1), "num_sgd_iter": at_least(1),
    "sgd_minibatch_size": at_least(1), "lr_schedule": schedule(), "training_intensity": positive,
    "training_intensity_schedule": schedule(positive=True),
    "replay_capacity": at_least(1), "learning_starts": non_negative, "target_network_update_freq": at_least(1),
    "n_step": at_least(1), "epsilon": schedule(0.0, 1.0), "vtrace_clip_rho": positive, "vtrace_clip_c": positive,
    "broadcast_interval": at_least(1), "tau": unit_interval, "critic_lr": positive, "alpha_lr": positive,
    "initial_alpha": positive, "alpha": positive, "policy_delay": at_least(1), "target_noise": non_negative,
    "target_noise_clip": non_negative, "exploration_noise": non_negative,
    "clip_rewards": lambda v: None if isinstance(v, bool) or v > 0 else "must be true, false or a positive bound",
    # losses
    "clip_param": positive, "vf_clip_param": positive, "vf_coeff": non_negative, "entropy_coeff": non_negative,
    "kl_coeff": non_negative, "kl_target": positive, "huber_delta": non_negative,
    # models
    "hiddens": each(at_least(1)), "init_log_std": between(-20, 5), "critic_hiddens": each(at_least(1)),
    "num_critics": at_least(1),
    # rollout, ray
    "num_workers": non_negative, "num_envs_per_worker": at_least(1), "rollout_fragment_length": at_least(1),
    "num_cpus_per_worker": positive, "max_worker_restarts": non_negative, "sample_timeout_s": positive,
    "num_cpus": at_least(1), "start_timeout_s": positive,
    # rollout=server
    "port": between(0, 65535), "max_clients": at_least(1), "max_episodes": at_least(1),
    "episode_timeout_s": positive, "max_request_bytes": at_least(1024), "finish_grace_s": non_negative,
    # run
    "seed": between(0, MAX_SEED), "torch_threads": at_least(1), "metrics_num_episodes_for_smoothing": at_least(1),
    "min_sample_timesteps_per_iteration": at_least(0), "min_time_s_per_iteration": non_negative,
    "every_n_iters": non_negative, "keep_last": at_least(1), "interval": non_negative, "num_episodes": at_least(1),
    "num_envs": at_least(1),
}
NON_EMPTY = ("output_dir", "tracking_uri", "experiment_name", "run_name", "artifact_location", "address", "id",
             "resume", "host", "token_file")


def check_domains(node: Any, path: str = "") -> None:
    """Check every field of a config dataclass tree against ``DOMAINS``, finiteness and emptiness."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        key = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value):
            check_domains(value, key)
            continue
        problem = _problem(f.name, value)
        if problem:
            raise ConfigError(f"{key}: {value!r} {problem}")


def _problem(name: str, value: Any) -> str | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        return "must not be empty" if name in NON_EMPTY and not value.strip() else None
    if _num(value) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, list) and any(_num(x) and not math.isfinite(x) for x in _flat(value)):
        return "must hold finite numbers only"
    rule = DOMAINS.get(name)
    if rule is None or not (_num(value) or isinstance(value, list)):
        return None
    return rule(value)


def _flat(v: list[Any] | tuple[Any, ...]) -> list[Any]:
    out: list[Any] = []
    for x in v:
        out += _flat(x) if isinstance(x, list | tuple) else [x]
    return out


ROW_BYTES = 512  # a generous upper bound for one sample row of the built-in columns with a small observation
SUB_ENV_BYTES = 64 * 1024  # per sub-env: its state plus the preallocated fragment buffers


def check_memory(train_batch_size: int, num_envs_per_worker: int, fragment: int) -> None:
    """Refuse sizes whose buffers alone could not fit in this machine's memory (estimate)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    batch = train_batch_size * ROW_BYTES
    envs = num_envs_per_worker * (SUB_ENV_BYTES + fragment * ROW_BYTES)
    for key, value, need in (("algo.train_batch_size", train_batch_size, batch),
                             ("rollout.num_envs_per_worker", num_envs_per_worker, envs)):
        if need > 0.8 * ram:
            raise ConfigError(f"{key}: {value:,} needs about {need / 2**30:,.0f} GiB of buffers; this machine has "
                              f"{ram / 2**30:,.0f} GiB")
