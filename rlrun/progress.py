"""The console progress line: live on a terminal, a plain line every few seconds otherwise."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any


class ProgressLine:
    """A live one-line status on a terminal; a plain line every ``every_s`` seconds otherwise."""

    def __init__(self, enabled: bool = True, every_s: float = 5.0) -> None:
        self.enabled = enabled
        self.tty = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        self.every_s = every_s
        self._last = 0.0
        self._status: Any = None

    def _text(self, r: Mapping[str, float]) -> str:
        ret = r.get("rollout/episode_return_mean", math.nan)
        return (f"iter {int(r['training_iteration']):>5}  steps {int(r['timesteps_total']):>9,}  "
                f"return {ret:8.2f}  {r.get('time/env_steps_per_s', 0.0):>8,.0f} steps/s  "
                f"{r['time_total_s']:7.1f} s")

    def update(self, r: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self._status is None:
                from rich.console import Console

                self._status = Console(stderr=False).status("", spinner="dots")
                self._status.start()
            self._status.update(self._text(r))
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            print(self._text(r), flush=True)

    def close(self, r: Mapping[str, float] | None, reason: str) -> None:
        if self._status is not None:
            self._status.stop()
        if self.enabled and r is not None:
            print(f"{self._text(r)}  -> stopped: {reason}", flush=True)
