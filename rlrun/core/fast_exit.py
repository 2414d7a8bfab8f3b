"""Ending a process without the interpreter's teardown, in one place.

With torch, mlflow and Ray's C++ core worker loaded, the interpreter's teardown takes ~2 s and
writes nothing of ours. rlrun's processes (the ``rlrun`` command, the MLflow writer) end with
``os._exit`` once their work is written. Python has no public call that runs the exit handlers
without the teardown, so the command line uses ``atexit._run_exitfuncs`` here and nowhere else.
"""

from __future__ import annotations

import os
import sys


def exit_now(code: int, run_exit_handlers: bool = True) -> None:
    """Flush stdout/stderr, run the ``atexit`` handlers (Ray's shutdown, logging) if asked, exit."""
    try:
        if run_exit_handlers:
            import atexit

            atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
