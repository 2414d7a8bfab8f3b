"""The episodes external clients drive, kept until their rows go to training.

The HTTP thread calls ``start``, ``act``, ``log_returns`` and ``end``; the trainer's thread calls
``take``. A row (one action) is complete once the observation after it is known: the next
``get_action``/``log_action`` of its episode, or ``end_episode``. ``take(n)`` hands out exactly n
complete rows as per-episode segments (an episode cut there bootstraps from V of the next
observation, as a rollout worker's fragment does). Once ``max_backlog`` complete rows wait, new
actions wait too (``backlogged``): clients run at the learner's pace, as in-process envs do. An
episode without a request for ``episode_timeout_s`` is abandoned: its rows not yet taken are
dropped and counted.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from rlrun.sources.serving.protocol import RequestError


@dataclass
class _Episode:
    number: int  # numeric id for the eps_id column
    training: bool
    last_seen: float
    # rows not yet handed to training: (obs, action, logp, value, dist_inputs, reward)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    taken: int = 0  # rows already handed to training (the episode's step index of rows[0])
    length: int = 0
    ended: bool = False
    truncated: bool = False
    final_obs: Any = None
    ret: float = 0.0
    next_obs: Any = None  # local inference: the observation after the last uploaded row (all rows complete)

    @property
    def complete(self) -> int:
        """Rows whose next observation is known."""
        return len(self.rows) if self.ended or self.next_obs is not None else max(len(self.rows) - 1, 0)


class Segment(NamedTuple):
    """Complete rows of one episode, in order, and how the segment ends."""

    eps_id: int
    t0: int  # index within the episode of the first row
    rows: list[tuple[Any, ...]]
    next_obs: Any  # the observation after the last row
    terminated: bool
    truncated: bool


class EpisodeTable:
    """Thread-safe. ``act(obs, action | None) -> (action, logp, value, dist_inputs)`` is the policy."""

    def __init__(self, act: Callable[[Any, Any], tuple[Any, float, float, np.ndarray]], episode_timeout_s: float,
                 max_episodes: int, max_backlog: int = 1 << 62) -> None:
        self._act = act
        self.timeout = episode_timeout_s
        self.max_episodes = max_episodes
        self.max_backlog = max_backlog  # complete rows waiting for the trainer before clients pause
        self._turn = 0
        self._lock = threading.Condition()
        self._open: dict[str, _Episode] = {}
        self._numbers = itertools.count()
        self._ready_rows = 0  # complete rows of training episodes not yet taken
        self.finished = False
        self.interrupted = False  # the run stopped without finishing: clients should retry (it may resume)
        self.num_abandoned = 0
        self._reaped = 0.0  # when _reap last looked
        self.returns: list[float] = []
        self.lengths: list[int] = []

    # ------------------------------------------------------------------ the HTTP thread
    def start(self, episode_id: str | None, training: bool) -> str:
        with self._lock:
            self.check_running()
            self._reap(time.monotonic())
            eid = episode_id or uuid.uuid4().hex
            if eid in self._open:
                raise RequestError(409, f"start_episode: episode '{eid}' is already open")
            if len(self._open) >= self.max_episodes:
                raise RequestError(503, f"start_episode: {len(self._open)} episodes are open, the most "
                                        "rollout.server.max_episodes allows; end some first")
            self._open[eid] = _Episode(next(self._numbers), training, time.monotonic())
            return eid

    def act(self, eid: str, obs: Any, action: Any = None, reward: float = 0.0) -> Any:
        """get_action (``action`` None: the policy chooses) or log_action (the client chose); ``reward``
        is the previous action's."""
        with self._lock:
            command = "get_action" if action is None else "log_action"
            ep = self._episode(eid, command)
            if ep.next_obs is not None:
                raise RequestError(409, f"{command}: episode '{eid}' is driven by uploaded samples")
            self._reward(ep, reward, command)
            chosen, logp, value, dist = self._act(obs, action)
            ep.length += 1
            if ep.training:
                ep.rows.append((obs, chosen, logp, value, dist, 0.0))
                if len(ep.rows) > 1:
                    self._ready(1)
            else:
                ep.rows[:] = [(obs, chosen, logp, value, dist, 0.0)]  # only the last one, for log_returns
            return chosen

    def log_returns(self, eid: str, reward: float) -> None:
        with self._lock:
            self._reward(self._episode(eid, "log_returns"), reward, "log_returns", always=True)

    def end(self, eid: str, obs: Any, truncated: bool, reward: float = 0.0) -> None:
        with self._lock:
            ep = self._episode(eid, "end_episode")
            if not ep.rows:
                raise RequestError(409, f"end_episode: episode '{eid}' has no action yet")
            self._reward(ep, reward, "end_episode")
            self._close(eid, ep, obs, truncated)
            if ep.training:
                self._ready(1)  # the last row is complete now

    def add_rows(self, eid: str, columns: dict[str, np.ndarray], next_obs: Any, end: str | None) -> None:
        """samples (local inference): rows the client recorded itself, all complete."""
        with self._lock:
            ep = self._episode(eid, "samples")
            if ep.rows and ep.next_obs is None:
                raise RequestError(409, f"samples: episode '{eid}' already has rows from get_action/log_action")
            c = columns
            n = len(c["rewards"])
            rows = list(zip(c["obs"], c["actions"], c["action_logp"].tolist(), c["vf_preds"].tolist(),
                            c["action_dist_inputs"], c["rewards"].tolist(), strict=True))
            ep.length += n
            ep.ret += float(c["rewards"].sum())
            ep.next_obs = next_obs
            if ep.training:
                ep.rows.extend(rows)
                self._ready(n)
            if end is not None:
                self._close(eid, ep, next_obs, end == "truncated")

    def _close(self, eid: str, ep: _Episode, final_obs: Any, truncated: bool) -> None:
        """The episode has ended: its return counts; a training episode stays until its rows are taken."""
        ep.ended, ep.truncated, ep.final_obs = True, truncated, final_obs
        if ep.training:
            self.returns.append(ep.ret)
            self.lengths.append(ep.length)
        else:
            del self._open[eid]

    def _reward(self, ep: _Episode, reward: float, command: str, always: bool = False) -> None:
        """Add ``reward`` to the episode's last action."""
        if not reward and not always:
            return
        if not ep.rows:
            raise RequestError(409, f"{command}: a reward before the episode's first action")
        obs, a, lp, v, d, r = ep.rows[-1]
        ep.rows[-1] = (obs, a, lp, v, d, r + reward)
        ep.ret += reward

    def _episode(self, eid: str, command: str) -> _Episode:
        self.check_running()
        ep = self._open.get(eid)
        if ep is None or ep.ended:
            raise RequestError(404, f"{command}: unknown or ended episode '{eid}' (start_episode first; "
                                    "an episode idle for rollout.server.episode_timeout_s is dropped)")
        ep.last_seen = time.monotonic()
        return ep

    def check_running(self) -> None:
        if self.interrupted:
            raise RequestError(503, "the run was interrupted and may be resumed: retry later")
        if self.finished:
            raise RequestError(410, "the run has finished")

    def _ready(self, n: int) -> None:
        self._ready_rows += n
        self._lock.notify_all()

    # ------------------------------------------------------------------ the trainer's thread
    def take(self, rows: int, timeout_s: float) -> list[Segment]:
        """Exactly ``rows`` complete rows (waits for them), as segments of one episode each; the
        episodes are visited round robin, so none waits behind the others."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._ready_rows < rows:
                now = time.monotonic()
                self._reap(now)
                if now >= deadline:
                    raise TimeoutError(f"{self._ready_rows} of {rows} rows from clients within {timeout_s:g} s")
                self._lock.wait(min(1.0, deadline - now))
            out: list[Segment] = []
            eids = list(self._open)
            self._turn = (self._turn + 1) % max(len(eids), 1)
            for eid in eids[self._turn:] + eids[: self._turn]:
                ep = self._open[eid]
                k = min(ep.complete, rows)
                if not ep.training or k <= 0:
                    continue
                ends = ep.ended and k == len(ep.rows)
                nxt = ep.final_obs if ends else ep.rows[k][0] if k < len(ep.rows) else ep.next_obs
                out.append(Segment(ep.number, ep.taken, ep.rows[:k], nxt, ends and not ep.truncated,
                                   ends and ep.truncated))
                ep.taken += k
                ep.rows = ep.rows[k:]  # an episode that goes on keeps its last, incomplete row
                self._ready_rows -= k
                rows -= k
                if ends:
                    del self._open[eid]
                if rows == 0:
                    break
            self._lock.notify_all()  # clients held back by ``backlogged`` may go on
            return out

    @property
    def backlogged(self) -> bool:
        """A full train batch waits already: clients pause until the trainer takes it, so experience
        is never more than one batch behind the weights and memory stays bounded."""
        return self._ready_rows >= self.max_backlog and not (self.finished or self.interrupted)

    def _reap(self, now: float) -> None:
        # a pass over every open episode: at most four times per timeout (once per start_episode it
        # took 4% of a busy server's time with 128 open episodes, py-spy)
        if now - self._reaped < min(1.0, self.timeout / 4):
            return
        self._reaped = now
        for eid, ep in list(self._open.items()):
            if not ep.ended and now - ep.last_seen > self.timeout:
                if ep.training:
                    self._ready_rows -= ep.complete
                del self._open[eid]
                self.num_abandoned += 1

    def pop_episodes(self) -> tuple[list[float], list[int]]:
        with self._lock:
            out = self.returns, self.lengths
            self.returns, self.lengths = [], []
            return out

    def finish(self) -> None:
        with self._lock:
            self.finished = True
            self._lock.notify_all()

    @property
    def num_open(self) -> int:
        return len(self._open)
