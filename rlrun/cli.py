"""The ``rlrun`` command: Hydra composes the config, rlrun validates it, then ``run(cfg)``.

This is the only module that sees a DictConfig. Config mistakes exit with status 2 and one line
naming the key and the value, before any env, model or Ray starts.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.resources import files
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from rlrun.checkpoint import CheckpointError
from rlrun.config import ConfigError, RunConfig, build_config
from rlrun.registry import RegistryError, load_plugins, suggest
from rlrun.tracking import TrackingError
from rlrun.worker_set import RayConnectionError, WorkerFailure

USER_ERRORS = (ConfigError, RegistryError, CheckpointError, TrackingError, RayConnectionError)


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


@hydra.main(version_base="1.3", config_path="pkg://rlrun.conf", config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from rlrun.run import run

    launch_dir = os.getcwd()  # version_base 1.3: Hydra does not chdir
    try:
        hc = HydraConfig.get()
        run_cfg = compose_to_config(cfg, launch_dir, hc.runtime.choices.get("experiment"),
                                    hc.runtime.output_dir)
        result = run(run_cfg, launch_dir=launch_dir)
    except USER_ERRORS as e:
        print(f"rlrun: error: {e}", file=sys.stderr)
        sys.exit(2)
    except WorkerFailure as e:
        print(f"rlrun: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("rlrun: interrupted; final checkpoint written, MLflow run marked KILLED", file=sys.stderr)
        sys.exit(130)
    return result.metrics.get("rollout/episode_return_mean")


GROUPS = ("algo", "loss", "model", "env", "rollout", "tracking", "debug", "experiment")


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
                return (f"{m[1]}: unknown config '{choice}'{suggest(choice, options)}. "
                        f"Known {m[1]} configs: {', '.join(options)}")
    return None


def main() -> None:
    problem = check_group_choices(sys.argv[1:])
    if problem:
        print(f"rlrun: error: {problem}", file=sys.stderr)
        sys.exit(2)
    _main()


if __name__ == "__main__":
    main()
