"""Hydra config -> validated ``RunConfig``: what ``rlrun <overrides>`` runs, for the CLI, tests and tools.

The only modules that see a DictConfig are this one and ``cli.py``; below them code receives typed
dataclasses.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from rlrun.config.schemas import RunConfig
from rlrun.config.typed import ConfigError
from rlrun.sources.plugins import load_plugins
from rlrun.training.validate import build_config

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
    if experiment and raw.get("experiment") in (None, experiment):  # a preset names itself; `experiment=x` wins
        raw["experiment"] = follow_env(raw, experiment)
    return build_config(raw)


def resolve_plain(raw: dict[str, Any]) -> dict[str, Any]:
    """Plain config data whose strings may hold interpolations (``${algo.lr}``), resolved as Hydra's
    config would be: a Tune trial's values set on the unresolved base move what follows them."""
    try:
        out: Any = OmegaConf.to_container(OmegaConf.create(raw), resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key}: missing mandatory value (set it, e.g. {e.full_key}=...)") from None
    except Exception as e:
        raise ConfigError(f"config does not resolve: {str(e).splitlines()[0]}") from None
    return dict(out)


def follow_env(raw: dict[str, Any], experiment: str) -> str:
    """A preset run on another env (``+experiment=ppo_cartpole env.id=Acrobot-v1``) keeps neither the
    preset's return target (met or missed on another scale) nor its experiment name; returns the name."""
    preset_env, preset_stop = _preset_env_and_stop(experiment)
    env_id = (raw.get("env") or {}).get("id")
    stop = raw.get("stop") or {}
    if preset_env is None or env_id in (preset_env, None) or not isinstance(stop, dict):  # None: no env, same task
        return experiment
    dropped = [k for k, v in stop.items() if "/" in str(k) and preset_stop.get(k) == v]
    for k in dropped:
        del stop[k]
    name = f"{(raw.get('algo') or {}).get('name', experiment)}_{env_id}"
    targets = f"its target {', '.join(f'{k} >= {preset_stop[k]}' for k in dropped)} is dropped and " if dropped else ""
    print(f"rlrun: note: env.id={env_id} is not the {preset_env} of +experiment={experiment}: {targets}the run is "
          f"filed under experiment '{name}'", flush=True)
    return name


def read_preset(experiment: str) -> dict[str, Any] | None:
    """A packaged ``+experiment`` preset's YAML (None for one from a user's config dir or a broken one)."""
    from importlib.resources import files

    import yaml

    try:
        data = yaml.safe_load(files("rlrun.conf").joinpath("experiment", f"{experiment}.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _preset_env_and_stop(experiment: str) -> tuple[str | None, dict[str, Any]]:
    """The env id a packaged preset runs and its ``stop`` section (None, {} for a preset from elsewhere)."""
    from importlib.resources import files

    import yaml

    data = read_preset(experiment)
    if data is None:
        return None, {}
    env_file = next((d["override /env"] for d in data.get("defaults", []) if isinstance(d, dict)
                     and "override /env" in d), None)
    try:
        env = yaml.safe_load(files("rlrun.conf").joinpath("env", f"{env_file}.yaml").read_text()) if env_file else {}
    except (OSError, yaml.YAMLError):
        return None, {}
    env_id = (data.get("env") or {}).get("id") or (env or {}).get("id")
    return env_id, dict(data.get("stop") or {})


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
