"""``rlrun --help`` and ``rlrun --version``, written for rlrun (Hydra's own help stays at ``--hydra-help``).

The config groups and their options are read from the packaged YAML files (each file's first comment
line is its description); the registered names come from the registries, so a plugin's entries show
up with ``plugins=[...]`` on the same command line."""

from __future__ import annotations

from importlib import metadata
from importlib.resources import files

from rlrun.core.version import __version__

GROUP_HELP = {
    "algo": "algorithm and its hyperparameters",
    "loss": "loss function and its coefficients (each algo names its default)",
    "model": "network",
    "env": "environment (any gymnasium id with env.id=...)",
    "rollout": "where and how experience is sampled",
    "tracking": "where runs are recorded",
    "debug": "quick checks",
    "experiment": "tuned presets: use with a plus, +experiment=<name>",
    "hparams_search": "hyperparameter searches (with -m)",
    "tune": "a population of trials with Ray Tune (tune=pbt: population-based training; no -m)",
}

USAGE = """\
usage: rlrun [+experiment=<preset>] [group=option ...] [key=value ...] [+key=value ...]
       rlrun -m <overrides with comma-separated values>     (a sweep: one run per combination)
       -v, --verbose: also show the libraries' INFO lines (Ray, MLflow, alembic, Optuna)

Train a reinforcement-learning agent from a YAML config and record it in MLflow.

examples:
  rlrun +experiment=ppo_cartpole                                   one run with a tuned preset
  rlrun -m +experiment=ppo_cartpole seed=0,1,2 algo.lr=1e-3,3e-4    a sweep of 6 runs
  rlrun-wait                                                       wait until MLflow holds every run here
  mlflow ui --backend-store-uri sqlite:///$PWD/mlflow.db           browse runs, metrics, checkpoints
  rlrun +experiment=ppo_cartpole --cfg job                         print the composed config
  rlrun +experiment=ppo_cartpole resume=latest                     continue the newest checkpoint
  rlrun rerun=<run id or name>                                     run a recorded run again, say what differs
  rlrun +experiment=ppo_cartpole tune=pbt                          population-based training, 4 trials (Ray Tune)
  rlrun-eval checkpoint=latest episodes=20 render=true             evaluate a saved policy (GIF)
  rlrun-eval checkpoint=latest explore=true output=data/cp       record its episodes (Parquet)
  rlrun +experiment=bc_cartpole input=data/cp                      train from recorded episodes
"""

TAIL = """\
output:
  outputs/<date>/<time>-<pid>/   config.yaml and checkpoints/iter_N/ of each run (multirun/... for sweeps)
  mlflow.db, mlartifacts/        the MLflow store in the launch directory (tracking=none: no store)

more: README.md; `rlrun --hydra-help` for Hydra's own flags (--cfg, --info, --config-dir, -m)."""


def describe(path_text: str) -> str:
    """The first comment line of a YAML file that is not a ``@package`` directive."""
    for line in path_text.splitlines():
        if line.startswith("#") and "@package" not in line:
            return line.lstrip("# ").strip()
        if line and not line.startswith("#"):
            break
    return ""


def groups_text() -> str:
    conf = files("rlrun.conf")
    out = ["config groups (group=option; keys with group.key=value):"]
    for group, what in GROUP_HELP.items():
        out.append(f"  {group}: {what}")
        for f in sorted((p for p in conf.joinpath(group).iterdir() if p.name.endswith(".yaml")),
                        key=lambda p: p.name):
            out.append(f"    {f.name[:-5]:<22} {describe(f.read_text())}".rstrip())
    return "\n".join(out)


def registries_text(argv: list[str]) -> str:
    """Registered names, after importing the ``plugins=[...]`` modules named in ``argv``."""
    from rlrun.app.cli_errors import load_argv_plugins
    from rlrun.core.registry import (
        ALGOS,
        CALLBACKS,
        DISTRIBUTIONS,
        ENVS,
        HEURISTICS,
        LOSSES,
        MODELS,
        OPTIMIZERS,
        POLICY_MAPPINGS,
        WRAPPERS,
    )

    problem = load_argv_plugins(argv)
    regs = {"algos": ALGOS, "losses": LOSSES, "models": MODELS, "action distributions": DISTRIBUTIONS,
            "optimizers (or any torch.optim class)": OPTIMIZERS,
            "envs (besides any gymnasium id and pettingzoo:<module>)": ENVS,
            "env wrappers (env.wrappers)": WRAPPERS, "callbacks (callbacks=[...])": CALLBACKS,
            "heuristic policies (multiagent.policies.<id>.heuristic)": HEURISTICS,
            "policy mapping functions (multiagent.policy_mapping_fn)": POLICY_MAPPINGS}
    out = ["registered names (loss=custom loss.name=<loss>, model=custom model.name=<model>, env.id=<env>):"]
    out += [f"  {what}: {', '.join(sorted(reg.names())) or '-'}" for what, reg in regs.items()]
    if problem:
        out.append(f"  (a plugin could not be imported: {problem})")
    return "\n".join(out)


def help_text(argv: list[str]) -> str:
    return "\n".join([USAGE, groups_text(), "", registries_text(argv), "", TAIL])


def version_text() -> str:
    def v(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    deps = ", ".join(f"{d} {v(d)}" for d in ("torch", "gymnasium", "hydra-core", "mlflow", "ray"))
    return f"rlrun {__version__} ({deps})"
