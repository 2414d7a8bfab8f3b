"""Where rlrun keeps what it can rebuild on this machine (an empty migrated MLflow store, inductor's compiled
kernels): ``$RLRUN_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlrun``, else ``~/.cache/rlrun``."""

from __future__ import annotations

import os


def cache_root() -> str | None:
    """The cache directory (not created here); None when it resolves to a relative path (no home)."""
    root = os.environ.get("RLRUN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rlrun")
    return root if os.path.isabs(root) else None
