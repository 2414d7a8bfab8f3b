"""The ``rlrun`` command called in this process: the CLI's own entry function
(``rlrun.app.cli.exit_status``, what ``python -m rlrun`` runs before it ends the process) with its argv,
working directory, stdout and stderr, and everything it changes put back afterwards. A refusal case
costs ~0.25 s this way (Hydra composes the config twice) against ~2-3 s for a fresh interpreter that
imports torch, Hydra and MLflow; a few cases of each kind still run as real processes
(tests/test_bad_input.py) and must give the same line.

Put back after each call: the working directory, ``sys.argv``, ``sys.path``, the environment, the
SIGTERM handler, torch's thread count, Hydra's global state, and the plugin modules the case imported
from its own directory with every registry entry they made (so the next case imports its own).
"""

from __future__ import annotations

import importlib
import io
import os
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CliResult:
    """What ``subprocess.run(..., capture_output=True, text=True)`` gives, as far as the tests read it."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _prepare() -> None:
    """Import what registers on import once, before the first case, so no case's clean-up removes it."""
    import rlrun.app.cli
    import rlrun.sources.worker_set
    import rlrun.training.trainer  # noqa: F401  (trainer hooks)
    from rlrun.sources.plugins import load_builtins

    load_builtins()


def _no_mode(self: object, config_name: object, overrides: object) -> None:
    return None


def cli_in_process(args: list[str], cwd: str | Path) -> CliResult:
    import torch
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    from rlrun.app import cli
    from rlrun.core import registry

    _prepare()
    real_get_mode = Hydra.get_mode
    cwd = Path(cwd).resolve()
    saved = (os.getcwd(), list(sys.argv), list(sys.path), dict(os.environ), signal.getsignal(signal.SIGTERM),
             torch.get_num_threads(), set(sys.modules))
    out, err = io.StringIO(), io.StringIO()
    try:
        os.chdir(cwd)
        sys.argv = ["rlrun", *args]
        importlib.invalidate_caches()
        # Hydra composes the whole config once more only to read ``hydra.mode`` (get_mode); no config of
        # ours sets it, so it is None for every case that does not set it itself: skipped (a third of a
        # case's time, 2026-11-26). Real processes (tests/test_bad_input.py AS_PROCESS) take Hydra's path.
        if not any("hydra.mode" in a for a in args):
            Hydra.get_mode = _no_mode  # type: ignore[method-assign]
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.exit_status()
    finally:
        Hydra.get_mode = real_get_mode  # type: ignore[method-assign]
        cwd_before, argv, path, environ, sigterm, threads, modules = saved
        os.chdir(cwd_before)
        sys.argv[:] = argv
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)
        signal.signal(signal.SIGTERM, sigterm)
        torch.set_num_threads(threads)
        GlobalHydra.instance().clear()
        plugins = {name for name in set(sys.modules) - modules
                   if Path(getattr(sys.modules[name], "__file__", None) or "/").resolve().is_relative_to(cwd)}
        for name in plugins:
            del sys.modules[name]
        for table in vars(registry).values():
            if isinstance(table, registry.Registry):
                for name in [n for n, e in table._entries.items() if getattr(e.obj, "__module__", None) in plugins]:
                    del table._entries[name]
    return CliResult(list(args), code, out.getvalue(), err.getvalue())
