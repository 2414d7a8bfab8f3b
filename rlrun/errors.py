"""The errors rlrun reports to a user as one clear line, kept free of heavy imports so the command
line (and a sweep's driver, which runs no training) can name them without loading torch or Ray.
Each is re-exported by the module that raises it."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, is not ours, or does not fit the config."""


class NonFiniteLossError(FloatingPointError):
    """A loss came out NaN or infinite; the run stops instead of training on garbage."""


class WorkerFailure(RuntimeError):
    """Remote workers kept dying past ``rollout.max_worker_restarts``."""


class RayConnectionError(RuntimeError):
    """``rollout.ray.address`` names no reachable Ray cluster."""
