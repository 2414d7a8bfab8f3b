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


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is not ours, or does not fit the config."""


class NonFiniteLossError(FloatingPointError):
    """A loss came out NaN or infinite; the run stops instead of training on garbage."""


class WorkerFailure(RuntimeError):
    """Remote workers kept dying past ``rollout.max_worker_restarts``."""


class RayConnectionError(RuntimeError):
    """``rollout.ray.address`` names no reachable Ray cluster."""
