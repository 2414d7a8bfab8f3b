"""Sweep bookkeeping that the driver, the jobs, ``run()`` and the report all need: a leaf module.

The driver writes ``<sweep dir>/rlrun_sweep.json`` (a ``SweepInfo``) before any job starts; every
job - in the driver's process or in a Ray task - reads it to find the MLflow parent run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SWEEP_FILE = "rlrun_sweep.json"
STEPS_TO_TARGET = "steps_to_target"  # objective: env steps when the stop target was met, else inf
TIME_TO_TARGET = "time_to_target"  # objective: training seconds (time_total_s) when it was met, else inf
TARGET_OBJECTIVES = (STEPS_TO_TARGET, TIME_TO_TARGET)


@dataclass
class SweepInfo:
    parent_run_id: str
    tracking_uri: str
    experiment_name: str
    launch_dir: str
    sweep_dir: str
    writer_address: str | None = None  # Unix socket of the sweep's shared MLflow writer (same machine)


@dataclass
class SweepJob:
    """What ``run()`` needs to make a job's MLflow run a child of the sweep."""

    info: SweepInfo
    tags: dict[str, str]
    log_file: Path | None = None
    recorded: bool = False  # set by run() once its MLflow run exists (it then records any failure)


def read_sweep_info(sweep_dir: str | Path) -> SweepInfo | None:
    path = Path(sweep_dir) / SWEEP_FILE
    if not path.is_file():
        return None
    return SweepInfo(**json.loads(path.read_text()))


def objective_value(name: str, result: Any) -> float:
    """The job's return value for sweepers: a reported metric, ``steps_to_target`` or ``time_to_target``
    (a trial that misses the target scores inf, however fast it failed)."""
    if name in TARGET_OBJECTIVES:
        counter = "timesteps_total" if name == STEPS_TO_TARGET else "time_total_s"
        return float(result.metrics[counter]) if result.target_met else math.inf
    value = result.metrics.get(name)
    return float(value) if value is not None else math.nan
