"""Sizes this machine cannot hold, refused before anything is built (one line naming the key, its value
and the estimate): the memory a run's models, replay buffers and sub-envs need at least, and the CPUs
the rollout workers of a private Ray instance ask for.

The memory estimates are lower bounds: the observation and action sizes are not known before an env
exists, so one float per observation is assumed. A refused config cannot run here; one that passes may
still be too big for the machine, and then fails where it allocates. Once the env's spaces are known (the
run's env probed, before the MLflow run starts), ``check_replay_memory`` sizes the replay buffers with them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rlrun.config.typed import ConfigError

PARAM_BYTES = 16  # a float32 parameter on the learner, its gradient and Adam's two moments
WEIGHT_BYTES = 4  # a parameter on a rollout worker (weights only)
REPLAY_ROW_BYTES = 32  # a stored transition at least: obs and next obs (a float each), action, reward, flags
ROLLOUT_ROW_BYTES = 48  # a row of a worker's fragment buffer at least (obs, action, reward, logp, value, ids)
SUB_ENV_BYTES = 1024  # a sub-env's own state, at least
FRACTION = 0.8  # of this machine's memory, the most a run may need
# the most CPUs one Tune trial may ask for (tune.cpus_per_trial, RLlib's num_cpus_for_driver): inf or 1e9
# would ask Ray for a bundle no machine has, and the trial would wait for it forever instead of failing
MAX_TRIAL_CPUS = 64


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def model_parameters(model: Any) -> dict[str, int]:
    """A lower bound of a model config's parameters per key that sizes them (``conv_filters``,
    ``hiddens``, ``cell_size``, ``post_hiddens``): each layer from the previous one's width, a
    one-channel image and a one-float observation at the input, the two smallest heads at the end."""
    out: dict[str, int] = {}
    width = 1
    channels = 1
    for f in getattr(model, "conv_filters", None) or []:
        if isinstance(f, list | tuple) and len(f) == 3 and all(isinstance(x, int) for x in f):
            n, k, _ = f
            out["conv_filters"] = out.get("conv_filters", 0) + n * channels * k * k + n
            channels = width = n
    for h in getattr(model, "hiddens", None) or []:
        if isinstance(h, int):
            out["hiddens"] = out.get("hiddens", 0) + width * h + h
            width = h
    cell = getattr(model, "cell_size", None)
    if isinstance(cell, int) and cell > 0:
        out["cell_size"] = 4 * cell * (width + cell + 2)
        width = cell
    for h in getattr(model, "post_hiddens", None) or []:
        if isinstance(h, int):
            out["post_hiddens"] = out.get("post_hiddens", 0) + width * h + h
            width = h
    out["heads"] = 2 * width + 2  # one action output and the value, at least
    # twin_q_mlp: each critic an MLP of critic_hiddens; twin_q_cnn: those over one encoder of their own
    critics = getattr(model, "num_critics", None)
    width = 1
    if isinstance(critics, int) and "conv_filters" in out:
        out["conv_filters"] *= 2
        width = channels
    for h in getattr(model, "critic_hiddens", None) or []:
        if isinstance(h, int) and isinstance(critics, int):
            out["critic_hiddens"] = out.get("critic_hiddens", 0) + critics * (width * h + h)
            width = h
    return out


def _models(cfg: Any) -> Iterator[tuple[str, Any]]:
    """(key prefix, model config) of the run's policies: the run's own, and each named policy's own."""
    yield "model", cfg.model
    for pid, p in (cfg.multiagent.policies or {}).items():
        if p.heuristic is None and p.snapshot_of is None and p.model:  # a snapshot has its source's
            from rlrun.config.multi_agent import policy_sections

            yield f"multiagent.policies.{pid}.model", policy_sections(cfg, pid).model


def gib(n: float) -> str:
    return f"{n / 2**30:,.0f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def check_resources(cfg: Any) -> None:
    """Refuse what cannot fit here: model parameters (learner and workers), replay capacity, sub-envs,
    and more rollout workers than a private Ray instance has CPUs for."""
    ram = machine_memory()
    if ram is not None:
        limit = FRACTION * ram
        # every remote worker holds the weights too, on this machine unless the run joins a cluster
        copies = int(cfg.rollout.num_workers) if _private_ray(cfg) else 0
        for prefix, model in _models(cfg):
            parts = model_parameters(model)
            need = sum(parts.values()) * (PARAM_BYTES + WEIGHT_BYTES * copies)
            if need > limit:
                key = max((k for k in parts if k != "heads"), key=lambda k: parts[k], default="hiddens")
                raise ConfigError(f"{prefix}.{key}: {getattr(model, key)} needs at least {gib(need)} for its "
                                  f"{sum(parts.values()):,} parameters (weights, gradients, optimizer state); this "
                                  f"machine has {gib(ram)}")
        capacity = getattr(cfg.algo, "replay_capacity", None)
        if isinstance(capacity, int) and capacity * REPLAY_ROW_BYTES > limit:
            raise ConfigError(f"algo.replay_capacity: {capacity:,} rows need at least "
                              f"{gib(capacity * REPLAY_ROW_BYTES)}; this machine has {gib(ram)}")
        n, fragment = cfg.rollout.num_envs_per_worker, cfg.rollout.rollout_fragment_length
        if isinstance(n, int):  # "auto" follows from train_batch_size, checked with the batch
            per_env = SUB_ENV_BYTES + ROLLOUT_ROW_BYTES * (fragment if isinstance(fragment, int) else 1)
            need = n * (copies + 1) * per_env
            if need > limit:
                raise ConfigError(f"rollout.num_envs_per_worker: {n:,} sub-envs on each of {copies + 1} workers need "
                                  f"at least {gib(need)}; this machine has {gib(ram)}")
    _check_cpus(cfg)


def _private_ray(cfg: Any) -> bool:
    """The run's Ray workers would run in a private instance on this machine: no cluster address, and not
    a job of the Ray sweep launcher (Ray already initialised: its cluster decides)."""
    ray = sys.modules.get("ray")
    return cfg.rollout.ray.address is None and not (ray is not None and ray.is_initialized())


def _check_cpus(cfg: Any) -> None:
    """A private local Ray instance (``rollout.ray.address: null``) has ``rollout.ray.num_cpus`` CPUs (all
    of this machine's by default): workers that ask for more would wait ``start_timeout_s`` and fail."""
    r = cfg.rollout
    if r.num_workers <= 0 or not _private_ray(cfg):  # in-process sampling, or a cluster that decides
        return
    cpus = r.ray.num_cpus or os.cpu_count() or 1
    need = r.num_workers * r.num_cpus_per_worker
    if need > cpus:
        raise ConfigError(f"rollout.num_workers: {r.num_workers} workers x rollout.num_cpus_per_worker="
                          f"{r.num_cpus_per_worker:g} need {need:g} CPUs; the local Ray instance has {cpus} "
                          f"(rollout.ray.num_cpus or this machine's cores). Lower num_workers or num_cpus_per_worker "
                          "(fractions are allowed), or join a cluster with rollout.ray.address")


def _space_bytes(space: Any) -> int:
    shape = getattr(space, "shape", None) or (1,)
    dtype = getattr(space, "dtype", None)
    return int(np.prod(shape)) * (np.dtype(dtype).itemsize if dtype is not None else 4)


def check_replay_memory(cfg: Any, spaces: Mapping[str, tuple[Any, Any]]) -> None:
    """Refuse replay buffers this machine cannot hold, sized with the env's spaces (``spaces``: policy id ->
    (observation, action) space): each row stores the observation twice (it and the n-step next one), the
    action, the reward and the discount. The buffers of all learned policies together; the largest is named."""
    from rlrun.config.multi_agent import learned_policy_sections

    ram = machine_memory()
    if ram is None:
        return
    needs = []
    for pid, prefix, sections in learned_policy_sections(cfg):
        capacity = getattr(sections.algo, "replay_capacity", None)
        if isinstance(capacity, int) and pid in spaces:
            obs, act = spaces[pid]
            row = 2 * _space_bytes(obs) + _space_bytes(act) + 8
            needs.append((capacity * row, prefix, capacity, obs))
    if needs and sum(n[0] for n in needs) > FRACTION * ram:
        _, prefix, capacity, obs = max(needs, key=lambda n: n[0])
        key = f"{prefix}algo"
        shape = "x".join(str(d) for d in (getattr(obs, "shape", None) or (1,)))
        raise ConfigError(f"{key}.replay_capacity: {capacity:,} rows of {shape} {getattr(obs, 'dtype', 'float32')} "
                          f"observations (each row holds two) need at least {gib(sum(n[0] for n in needs))}; "
                          f"this machine has {gib(ram)}")
