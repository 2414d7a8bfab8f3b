"""The ``input``, ``output`` and ``offline`` settings of a run, and their checks.

    input: sampler                         # the rollout workers (default)
    input: data/cartpole                   # a directory (or glob) of rlrun Parquet files
    input: minari:cartpole/expert-v0       # a local Minari dataset
    input: {sampler: 0.5, data/cartpole: 0.5}   # a weighted mix per train batch
    output: data/run1                      # also write every sampled batch there (or minari:<new id>)

Kept free of torch and pyarrow so the CLI can check a config before importing either.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlrun.config.typed import ConfigError, show
from rlrun.core.errors import suggest
from rlrun.core.registry import SOURCES

SAMPLER = "sampler"
FILES = "files"  # the experience source of a path or glob: rlrun Parquet files
METHODS = ("is", "wis", "dm", "dr", "wdr")  # off-policy estimators (rlrun/data/estimators.py)
MINARI = "minari:"
OPE_FIELDS = ("v_target", "v_behavior", "v_gain", "v_target_ci_low", "v_target_ci_high")  # ope/<method>/<field>


@dataclass
class OfflineConfig:
    shuffle_buffer: int = 10_000  # rows read ahead and drawn at random (1: file order)
    output_file_size_mb: float = 64.0  # an output file is closed once its rows reach about this size
    # also write the algorithm's postprocessed columns (advantages, value targets, ...) to output files
    output_postprocessed: bool = False
    evaluation: list[str] = field(default_factory=list)  # off-policy estimators: is, wis, dm, dr, wdr (offline/ope.py)
    evaluation_input: str | None = None  # their held-out episodes (rlrun Parquet); None: the input files
    evaluation_interval: int = 10  # estimate every N iterations
    evaluation_episodes: int = 200  # at most this many whole episodes of evaluation_input
    fqe_steps: int = 5000  # dm, dr: minibatch steps fitting Q^pi (fitted Q evaluation)


def parse_input(value: Any, key: str = "input") -> list[tuple[str, float]]:
    """``input`` -> ``[(source, weight)]`` with weights summing to 1: ``sampler`` or a path/glob."""
    if value is None:  # the offline presets leave it to the user
        raise ConfigError(f"{key}: this run trains from recorded data: set {key}=<dir of rlrun Parquet files>; "
                          "record some with `rlrun-eval checkpoint=<a trained run> episodes=100 explore=true "
                          "output=<dir>` or any run with output=<dir>")
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{key}: empty; use 'sampler' or a directory of rlrun Parquet files")
        return [(value, 1.0)]
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{key}: expected 'sampler', a directory or glob of Parquet files, or a mapping "
                          f"{{source: weight}}, got {show(value)}")
    out: list[tuple[str, float]] = []
    for source, weight in value.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{key}.{source}: weight must be a positive number, got {show(weight)}")
        out.append((str(source), float(weight)))
    total = sum(w for _, w in out)
    return [(s, w / total) for s, w in out]


def _check_files(source: str, key: str) -> None:
    try:
        input_files(source, key)
    except ConfigError as e:  # perhaps a misspelled source name
        named = [n for n in SOURCES if n != FILES and not SOURCES.entry(n).info.get("prefix")]
        if not named:
            raise
        raise ConfigError(f"{e}; or a registered experience source{suggest(source, named)}: {', '.join(named)}") \
            from None


def check_minari_entry(source: str, key: str) -> None:
    if not source[len(MINARI):].strip():
        raise ConfigError(f"{key}: '{source}': name the dataset, e.g. minari:cartpole/expert-v0")


def source_name(entry: str) -> str:
    """The ``SOURCES`` name an ``input`` entry selects: the entry itself when it is a registered name,
    the source whose ``prefix`` it starts with (``minari:<id>``), else ``files`` (a path or glob)."""
    if entry in SOURCES:
        return entry
    prefixed = [n for n in SOURCES if entry.startswith(SOURCES.entry(n).info.get("prefix") or "\0")]
    return prefixed[0] if prefixed else FILES


def is_sampler_only(value: Any) -> bool:
    return value == SAMPLER


def input_files(source: str, key: str = "input") -> list[Path]:
    """The Parquet files of one input source (a directory, searched recursively, or a glob), sorted;
    refused when there are none."""
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(Path(root, name) for root, _, names in os.walk(path, followlinks=True) for name in names
                       if name.endswith(".parquet") and not name.startswith((".", "_")))
    elif path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if p.endswith(".parquet"))
    if not files:
        what = "no .parquet files in directory" if path.is_dir() else "no such directory or file"
        raise ConfigError(f"{key}: {what} '{source}'. Record data with `rlrun ... output=<dir>` or "
                          f"`rlrun-eval checkpoint=latest episodes=100 explore=true output=<dir>`")
    return files


def check_offline_config(cfg: Any) -> None:
    """``input``/``output``/``offline`` values, before compute. ``cfg`` is a RunConfig."""
    sources = parse_input(cfg.input)
    o = cfg.offline
    if o.shuffle_buffer < 1:
        raise ConfigError(f"offline.shuffle_buffer: must be at least 1, got {o.shuffle_buffer}")
    if not o.output_file_size_mb > 0:
        raise ConfigError(f"offline.output_file_size_mb: must be positive, got {o.output_file_size_mb:g}")
    _check_evaluation(cfg, sources)
    for source, _ in sources:
        key = "input" if len(sources) == 1 else f"input.{source}"
        name = source_name(source)
        if source == SAMPLER:
            continue
        if name == FILES:
            _check_files(source, key)
        elif (check := SOURCES.entry(name).info.get("check")) is not None:
            check(source, key)  # the rest is checked against the env's spaces (sources/offline_input.py)
    offline_sources = [s for s, _ in sources if s != SAMPLER]
    if offline_sources and cfg.multiagent.policies:
        raise ConfigError("input: multi-agent runs train from their rollout workers only (input=sampler); read one "
                          "policy's recorded data in a single-agent run: input=<output dir>/<policy id>")
    if offline_sources and cfg.model and _recurrent(cfg.model.name):
        raise ConfigError(f"input: recurrent models (model.name={cfg.model.name}) train from their rollout workers "
                          "only (input=sampler)")
    if cfg.output is not None:
        _check_output(cfg, offline_sources)


def _check_evaluation(cfg: Any, sources: list[tuple[str, float]]) -> None:
    o = cfg.offline
    for i, m in enumerate(o.evaluation):
        if m not in METHODS:
            raise ConfigError(f"offline.evaluation[{i}]: unknown estimator {show(m)}; known: {', '.join(METHODS)}")
    for key in ("evaluation_interval", "evaluation_episodes", "fqe_steps"):
        if getattr(o, key) < 1:
            raise ConfigError(f"offline.{key}: must be at least 1, got {getattr(o, key)}")
    if o.evaluation and cfg.multiagent.policies:
        raise ConfigError("offline.evaluation: off-policy estimates are for single-agent runs")
    if o.evaluation and o.evaluation_input is None and all(s == SAMPLER for s, _ in sources):
        raise ConfigError("offline.evaluation: the estimators need recorded episodes: set offline.evaluation_input="
                          "<dir of rlrun Parquet files> (held-out data of the behaviour policy)")
    if o.evaluation_input is not None and not o.evaluation_input.startswith(MINARI):
        input_files(o.evaluation_input, "offline.evaluation_input")


def _check_output(cfg: Any, offline_sources: list[str]) -> None:
    if cfg.output.startswith(MINARI) and cfg.multiagent.policies:
        raise ConfigError("output: a multi-agent run writes rlrun Parquet files (one directory per policy), "
                          "not a Minari dataset")
    # a Minari id's form, and that no dataset has it yet: rlrun/training/validate.py (asks rlrun/data/minari.py)
    out = Path(cfg.output).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output: '{cfg.output}' exists and is not a directory")
    if cfg.rollout.observation_filter != "none":
        raise ConfigError(f"output: recording with rollout.observation_filter={cfg.rollout.observation_filter} is "
                          "not supported (batches hold filtered observations); set rollout.observation_filter=none")
    for source in offline_sources:
        if source == cfg.output or Path(source).expanduser().resolve() == out.resolve():
            raise ConfigError(f"output: '{cfg.output}' is also an input; write to another directory")


def _recurrent(model_name: str) -> bool:
    from rlrun.core.registry import MODELS

    return bool(model_name in MODELS and MODELS.entry(model_name).info.get("recurrent"))
