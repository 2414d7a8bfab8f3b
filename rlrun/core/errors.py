"""The errors rlrun reports to a user as one clear line, kept free of heavy imports so the command
line (and a sweep's driver, which runs no training) can name them without loading torch or Ray.
Each is re-exported by the module that raises it."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def suggest(name: str, known: Sequence[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known name, or an empty string."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def first_line(e: BaseException, empty: str | None = None) -> str:
    """The first line of ``e``'s message; ``empty`` (default: the exception's type name) if it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else (type(e).__name__ if empty is None else empty)


def one_line(e: BaseException) -> str:
    """``TypeName: the first line of the message``: an exception from a library, in one line."""
    return f"{type(e).__name__}: {first_line(e, '')}"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is not ours, or does not fit the config."""


class NonFiniteLossError(FloatingPointError):
    """A loss came out NaN or infinite; the run stops instead of training on garbage."""


class WorkerFailure(RuntimeError):
    """Remote workers kept dying past ``rollout.max_worker_restarts``."""


class RayConnectionError(RuntimeError):
    """``rollout.ray.address`` names no reachable Ray cluster."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (systemd, Slurm, Kubernetes stopping a job): handled exactly like Ctrl-C - final
    checkpoint, run marked KILLED - but the process exits 143 (128 + SIGTERM)."""


class RunInterrupted(KeyboardInterrupt):
    """What ``run()`` raises after Ctrl-C or SIGTERM, once the run is wound down: how it was stopped
    and the final checkpoint it wrote (None if no iteration had finished)."""

    def __init__(self, sigterm: bool, checkpoint: str | None) -> None:
        super().__init__("SIGTERM" if sigterm else "Ctrl-C")
        self.sigterm = sigterm
        self.checkpoint = checkpoint


def is_sigterm(e: BaseException) -> bool:
    return isinstance(e, Terminated) or (isinstance(e, RunInterrupted) and e.sigterm)


class PluginError(ValueError):
    """User code (a model, a loss, an env) broke its contract: wrong shapes, wrong return types."""


class DataError(ValueError):
    """Offline data that cannot be used (a file, a column, a value): one line naming the file and column."""
