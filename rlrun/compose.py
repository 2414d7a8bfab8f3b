"""Hydra config -> validated ``RunConfig``: what ``rlrun <overrides>`` runs, for the CLI, tests and tools.

The only modules that see a DictConfig are this one and ``cli.py``; below them code receives typed
dataclasses.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from rlrun.config import ConfigError, RunConfig, build_config
from rlrun.plugins import load_plugins

# ${rlrun_pid:} in hydra.run.dir / hydra.sweep.dir: runs started in the same second get their own dirs
if not OmegaConf.has_resolver("rlrun_pid"):
    # cached: Hydra copies the driver's resolver cache into every job's config, so jobs in other processes
    # (the Ray launcher) resolve the same sweep dir
    OmegaConf.register_new_resolver("rlrun_pid", lambda: str(os.getpid()), use_cache=True)


def compose_to_config(
    cfg: DictConfig, launch_dir: str, experiment: str | None = None, output_dir: str | None = None
) -> RunConfig:
    """Resolved Hydra config -> validated RunConfig (plugins imported first)."""
    try:
        raw: Any = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key}: missing mandatory value (set it, e.g. {e.full_key}=...)") from None
    except Exception as e:  # an interpolation that does not resolve
        raise ConfigError(f"config does not resolve: {str(e).splitlines()[0]}") from None
    raw.pop("hydra", None)
    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list):
        raise ConfigError(f"plugins: expected a list of module names, got {plugins!r}")
    load_plugins([str(p) for p in plugins], search_dirs=[launch_dir])
    if raw.get("output_dir") is None:
        raw["output_dir"] = output_dir
    if raw.get("experiment") is None:
        raw["experiment"] = experiment
    return build_config(raw)


def compose(overrides: list[str], launch_dir: str | None = None) -> RunConfig:
    """Compose and validate a config exactly as ``rlrun <overrides>`` would (for tests and tools)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module("rlrun.conf", version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
        experiment = cfg.hydra.runtime.choices.get("experiment")
        with open_dict(cfg):
            del cfg["hydra"]
    return compose_to_config(cfg, launch_dir or os.getcwd(), experiment)
