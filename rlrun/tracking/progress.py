"""What a run prints: a live progress bar on a terminal (plain lines every few seconds otherwise),
evaluation results as they come, and a summary at the end that says where the results are."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RETURN = "rollout/episode_return_mean"
EVAL_RETURN = "eval/episode_return_mean"
LOSS = "train/loss/total"
BUDGETS = ("timesteps_total", "training_iteration", "time_total_s", "episodes_total")  # first set one wins


BAR_WIDTH = 20  # the live line's bar, in columns
OTHER_COLUMNS = 19  # its percentage, elapsed time and the spaces between columns


class ProgressLine:
    """On a terminal, a rich progress bar against the run's budget (the first counter in ``stop``)
    with the return against the target; otherwise one plain line every ``every_s`` seconds. An
    evaluation result is always printed on a line of its own."""

    def __init__(self, enabled: bool = True, every_s: float = 5.0, stop: Mapping[str, float] | None = None,
                 evaluated: bool = True, console: Any = None) -> None:
        self.enabled = enabled
        self.console = console  # rich's Console for the live line (None: the terminal's)
        self.tty = console is not None or (sys.stdout.isatty() and os.environ.get("TERM") != "dumb")
        self.every_s = every_s
        self.stop = dict(stop or {})
        self._last = 0.0
        self._printed_iter = -1
        self._bar: Any = None
        self._task: Any = None
        self._last_eval = math.nan  # an offline run shows its last greedy return: it samples no episodes
        self.evaluated = evaluated  # False (evaluation.interval 0): an offline run shows its training loss

    def _text(self, r: Mapping[str, float], compact: bool = False) -> str:
        # the return the run is stopped on (a multi-agent run's rollout/<policy>/...), else the episode return
        key = next((k for k in self.stop if k.startswith("rollout/") and k.endswith("episode_return_mean")), RETURN)
        label = "return" if key == RETURN else f"{key.split('/')[1]} return"
        ret = r.get(key, math.nan)
        steps = "steps"
        if "offline/rows_read" in r and math.isnan(ret):  # trained from files only: rows, and the greedy return
            key, label, ret, steps = EVAL_RETURN, "eval return", self._last_eval, "rows"
            if not self.evaluated:  # no greedy return to show (e.g. no env): the training loss
                key, label, ret = LOSS, "loss", r.get(LOSS, math.nan)
        target = f" / {self.stop[key]:g}" if key in self.stop else ""
        if compact:  # a narrow terminal's live line: ~50 columns
            return (f"iter {int(r['training_iteration'])}  {int(r['timesteps_total']):,} {steps}  {label} {ret:.2f}"
                    f"{target.replace(' ', '')}  {r.get('time/env_steps_per_s', 0.0):,.0f}/s")
        return (f"iter {int(r['training_iteration']):>5}  {steps} {int(r['timesteps_total']):>9,}  "
                f"{label} {ret:8.2f}{target}  {r.get('time/env_steps_per_s', 0.0):>8,.0f} {steps}/s  "
                f"{r['time_total_s']:7.1f} s")

    def _budget(self) -> tuple[str, float] | None:
        return next(((k, float(self.stop[k])) for k in BUDGETS if self.stop.get(k)), None)

    def update(self, r: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        if EVAL_RETURN in r:
            self._last_eval = r[EVAL_RETURN]
            unit = "rows" if "offline/rows_read" in r else "steps"
            self._print(f"eval at {int(r['timesteps_total']):,} {unit}: return {r[EVAL_RETURN]:.2f} "
                        f"(greedy, {int(r.get('eval/num_episodes', 0))} episodes)")
        if self.tty:
            self._live(r)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._print(self._text(r))
            self._printed_iter = int(r["training_iteration"])

    def _live(self, r: Mapping[str, float]) -> None:
        budget = self._budget()
        if self._bar is None:
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=BAR_WIDTH),
                                 TaskProgressColumn(), TimeElapsedColumn(), transient=True, console=self.console)
            self._task = self._bar.add_task("", total=budget[1] if budget else None)
            self._bar.start()
        text = self._text(r)
        if len(text) + BAR_WIDTH + OTHER_COLUMNS > self._bar.console.width:  # rich would cut it: the short form
            text = self._text(r, compact=True)
        self._bar.update(self._task, completed=r.get(budget[0], 0.0) if budget else 0.0, description=text)

    def _print(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, flush=True)

    def close(self, r: Mapping[str, float] | None) -> None:
        """The last iteration's line (unless it was just printed)."""
        if self._bar is not None:
            self._bar.stop()
        if self.enabled and r and int(r["training_iteration"]) != self._printed_iter:
            print(self._text(r), flush=True)


@dataclass(frozen=True)
class Summary:
    """What the end of a run tells the user."""

    reason: str
    target_met: bool
    history: list[dict[str, float]]
    wall_s: float
    output_dir: Path
    checkpoint: Path | None
    run_name: str | None
    run_id: str | None
    experiment: str
    tracking_uri: str | None
    experiment_id: str | None = None
    writer_pid: int | None = None  # the MLflow writer still finishing the run in the background
    window: int = 100  # metrics_num_episodes_for_smoothing: the episodes the training return averages
    resumed_from: str | None = None  # a resumed run: the checkpoint it continued (rlrun/app/resume.py)

    def _policy_lines(self, last: Mapping[str, float]) -> list[str]:
        """Multi-agent runs: each policy's return (its agents' episodes); the line above sums all agents."""
        out = []
        for key in sorted(k for k in last if k.count("/") == 2 and k.startswith("rollout/")
                          and k.endswith("/episode_return_mean")):
            series = [h[key] for h in self.history if not math.isnan(h.get(key, math.nan))]
            if series:
                out.append(f"    {key.split('/')[1]}: final {series[-1]:.1f}, best {max(series):.1f}")
        return ["  policies   (their agents' episode returns)", *out] if out else []

    def lines(self) -> list[str]:
        last = self.history[-1] if self.history else {}
        returns = [h[RETURN] for h in self.history if not math.isnan(h.get(RETURN, math.nan))]
        evals = [h[EVAL_RETURN] for h in self.history if EVAL_RETURN in h]
        ret = f"final {returns[-1]:.1f}, best {max(returns):.1f}" if returns else "no episode finished"
        policies = self._policy_lines(last)
        summed = "every agent's rewards summed, " if policies else ""  # a zero-sum game's is 0: see each policy's
        counted = "rows read" if "offline/rows_read" in last else "env steps"  # an offline run counts rows
        out = [f"rlrun: stopped: {self.reason}{' (target met)' if self.target_met else ''}",
               f"  return     {ret} ({summed}mean of the last {self.window} episodes)"
               + (f"; greedy eval {evals[-1]:.1f}" if evals else ""),
               *policies,
               f"  {counted:<10} {int(last.get('timesteps_total', 0)):,} in {self.wall_s:.1f} s",
               f"  output     {self.output_dir}",
               *([f"  resumed    {self.resumed_from}"] if self.resumed_from else [])]
        if self.checkpoint is not None:
            out.append(f"  checkpoint {self.checkpoint}")
        uri = self.tracking_uri or ""
        server = uri if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
        if self.run_id:
            out.append(f"  MLflow     run '{self.run_name}' ({self.run_id}) in experiment '{self.experiment}'")
        elif self.writer_pid is not None:  # the writer had not created the run yet when training ended
            out.append(f"  MLflow     run '{self.run_name}' in experiment '{self.experiment}' (being created)")
        if (self.run_id or self.writer_pid is not None) and server != uri:
            out.append(f"  browse     mlflow ui --backend-store-uri {uri}")
        if self.run_id:  # workflowType: MLflow 3.17's UI otherwise opens in its GenAI view (traces, token usage)
            out.append(f"  open       {server.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
                       "?workflowType=machine_learning")
        if self.writer_pid is not None:
            out.append(f"  finishing  the MLflow model, curve and status in the background (pid {self.writer_pid}); "
                       f"`rlrun-wait {self.output_dir}` waits for them")
        return out
