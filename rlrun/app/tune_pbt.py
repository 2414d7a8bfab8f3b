"""Tune's synchronous population-based training (``tune=pbt tune.synch=true``) without its two endless waits.

In Tune's synchronous PBT (2.60) every trial that reaches a round (``time_attr`` >= the round's time) is paused
until all live trials have; then the round's exploits and explores run, and the trials go on to the next round.
Two orderings leave a population waiting for good, its trials PAUSED, nothing running, Tune never ending:

1. At a round Tune sets every trial's last perturbation to the time of the trial that reported last, and a trial
   takes part in the next round only once an interval has passed since then. A trial that reached the round
   sooner, whose step lands past the next round's time but under an interval past that, goes on through the
   round; the trials that stop there wait for it, and if it then reaches its stop they wait forever. (A
   ``tests/test_tune.py`` run of 2026-12-07 with a 1,024-step interval: one trial at 2,075 env steps went on,
   1,022 past the last reporter's 1,053; the other waited at 2,077 until the test was killed 15 minutes later.)
   Here a trial takes part in every round its time reaches, and in no round before its time reaches it.
2. A trial's last result (its ``stop`` reached, or an error) does not reach the scheduler, so a trial that ends
   while the others wait at a round never brings the round about. When every live trial waits at a round that
   none can bring about, the round is given up and they go on (the population is at its end).

Asynchronous PBT (``synch=False``) shares time: a trial that reaches its perturbation while any other trial is
PENDING or PAUSED is paused, so that more trials than CPUs take turns. When every trial runs at once (rlrun's
default: ``tune.time_share`` null), a trial is only PENDING while it restarts after its own exploit, and pausing
another then costs that one a restart (a new process, its envs' episodes in progress) for nothing; with
``time_share=False`` only a trial's own exploit pauses it.
"""

from __future__ import annotations

from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining


class SynchronousPBT(PopulationBasedTraining):
    """``PopulationBasedTraining`` whose rounds (``synch=True``) every trial reaches and none waits at for a trial
    that has ended, and which (``synch=False``, ``time_share=False``) pauses a trial for its own exploit only
    (the module docstring says how Tune's own can hang, and when its time sharing costs restarts)."""

    def __init__(self, *args: Any, time_share: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.time_share = time_share

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        time = result.get(self._time_attr)
        if self._synch and time is not None and self._metric in result:
            # Tune takes a trial into the round when time - last_perturbation_time >= interval: set the trial's
            # last perturbation so that this holds exactly when its time has reached the round
            state = self._trial_state[trial]
            since = time - self._perturbation_interval
            if time >= self._next_perturbation_sync:
                state.last_perturbation_time = min(state.last_perturbation_time, since)
            else:  # not yet: under one interval from its last perturbation, whatever the last reporter's time
                state.last_perturbation_time = max(state.last_perturbation_time, since + 1)
        decision = str(super().on_trial_result(tune_controller, trial, result))
        if decision == self.PAUSE and not self._synch and not self.time_share and trial.status != Trial.PAUSED:
            return str(self.CONTINUE)  # paused only to let another trial run: every trial runs at once here
        return decision

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        chosen = super().choose_trial_to_run(tune_controller)
        if chosen is not None or not self._synch:
            return chosen
        live = tune_controller.get_live_trials()
        if live and all(t.status == Trial.PAUSED for t in live):
            # all live trials wait at the round and none is running to bring it about: give the round up
            latest = max(self._trial_state[t].last_train_time for t in live)
            self._next_perturbation_sync = max(self._next_perturbation_sync, latest) + self._perturbation_interval
            chosen = super().choose_trial_to_run(tune_controller)
        return chosen
