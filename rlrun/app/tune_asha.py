"""Tune's ASHA scheduler, remembering the trials it stopped and when (``tune=asha``, rlrun/app/tune_run.py):
those trials ended, they were not cut short by Ctrl-C.

A module of its own, imported only when ASHA is used (it imports Ray). Tune works on a serialised copy of
the scheduler it is given, so the record cannot live in the instance: it is this module's ``STOPPED``,
which the copy's class (found by its name, this module's) writes to in the driver's process."""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

STOPPED: dict[str, float] = {}  # trial id -> its time_attr when ASHA stopped it (this process's Tune run)


class RecordingASHA(ASHAScheduler):
    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        action: str = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP:
            STOPPED[str(trial.trial_id)] = float(result.get(self._time_attr, 0))
        return action
