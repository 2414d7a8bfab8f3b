"""rlrun's optional parts: which pip extra installs each package they need, and the one line that says
so when it is missing (``pip install -e .`` is the core: single-agent runs on gymnasium's envs,
sweeps with Hydra's basic launcher, the MLflow record)."""

from __future__ import annotations

import importlib.util

from rlrun.config.typed import ConfigError

# import name -> the extra of pyproject.toml that installs it
EXTRA_OF = {
    "ray": "ray", "hydra_plugins.hydra_ray_launcher": "ray-launcher",
    "hydra_plugins.hydra_optuna_sweeper": "optuna", "optuna": "optuna",
    "pettingzoo": "multiagent", "mpe2": "multiagent",
    "minigrid": "minigrid",
    "minari": "offline",
    "uvicorn": "serving", "httptools": "serving",
    "ale_py": "atari", "mujoco": "mujoco", "Box2D": "box2d", "envpool": "envpool",
}


def install_hint(module: str) -> str:
    """``install rlrun's <extra> extra: pip install -e ".[<extra>]"`` (else ``pip install <module>``)."""
    extra = EXTRA_OF.get(module) or EXTRA_OF.get(module.split(".", 1)[0])
    return f'install rlrun\'s {extra} extra: pip install -e ".[{extra}]"' if extra else f"pip install {module}"


def available(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing
        return False


def require(module: str, what: str) -> None:
    """``what`` (a config key and value) needs ``module``: one line naming the extra when it is missing."""
    if not available(module):
        raise ConfigError(f"{what} needs the {module} package, which is not installed; {install_hint(module)}")
