"""What the libraries under rlrun may print on a normal run or sweep, and what ``-v`` lets through.

Quiet by default: the lines a user needs come from rlrun (progress, the summary, one line per sweep
job); library chatter that says nothing they can act on is held back at WARNING, and ``rlrun -v``
(or ``--verbose``) restores the libraries' own levels. Errors and warnings always show.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator

VERBOSE_ENV = "RLRUN_VERBOSE"

# INFO loggers held at WARNING unless -v: alembic announces its 7 plugins when optuna imports it
# ("[HYDRA] setup plugin alembic.autogenerate.schemas", ...), mlflow creates tables, Ray says it started
QUIET_LOGGERS = ("alembic", "mlflow.store.db.utils", "ray")
# Hydra's launchers list every job's overrides; sweepers such as Optuna's write floats with 16-17
# digits (algo.lr=0.0017692267954532756): shown to 4 significant digits (the exact values are the
# MLflow params and the sweep's multirun.yaml / optimization_results.yaml)
LAUNCHER_LOGGERS = ("hydra._internal.core_plugins.basic_launcher", "hydra_plugins.hydra_ray_launcher._core",
                    "hydra_plugins.hydra_ray_launcher.ray_launcher")
_LONG_FLOAT = re.compile(r"(?<![\w.])(-?\d+\.\d{6,}(?:e[-+]?\d+)?)(?![\w.])")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def short_floats(text: str) -> str:
    """``algo.lr=0.0017692267954532756`` -> ``algo.lr=0.001769``; other text unchanged."""
    return _LONG_FLOAT.sub(lambda m: f"{float(m[1]):.4g}", text)


class _ShortFloats(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = short_floats(record.getMessage()), None
        return True


def take_verbose_flag(argv: list[str]) -> list[str]:
    """``argv`` without ``-v``/``--verbose``; sets ``RLRUN_VERBOSE=1`` (inherited by sweep jobs) when given."""
    rest = [a for a in argv if a not in ("-v", "--verbose")]
    if len(rest) != len(argv):
        os.environ[VERBOSE_ENV] = "1"
    return rest


def quiet_libraries() -> None:
    """Set up the console for a run or sweep; call before Ray, MLflow or a sweeper is imported."""
    # a sweep's jobs print lines that differ only in numbers; Ray would fold them into
    # "[repeated 2x across cluster]" and drop the rest
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # no raw ANSI escapes in a log file or pipe
    for name in LAUNCHER_LOGGERS:
        logging.getLogger(name).addFilter(_ShortFloats())
    if verbose():
        return
    # conf/hydra/launcher/ray.yaml deliberately replaces the plugin's `ray` config (same schema)
    # (the message starts with a newline: (?s) lets .* cross it)
    warnings.filterwarnings("ignore", message="(?s).*is validated against ConfigStore schema with the same name")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def quiet_optuna() -> None:
    """Optuna's "A new study created in memory" (colour codes included) on stderr; its level is set
    when optuna is first imported, so this imports it (only sweeps with the Optuna sweeper call it)."""
    if verbose():
        return
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


@contextlib.contextmanager
def no_download_bars() -> Iterator[None]:
    """MLflow's "Downloading artifacts" progress bar off while artifacts download (it would print
    outside rlrun's console, after the summary of a resumed or rerun run)."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
