"""What a run records about itself: the flattened config as MLflow params, the git state (SHA, dirty flag,
the patch of uncommitted changes), the installed packages, the machine, and the source of plugin modules
that live outside the installed packages - enough to run it again (``rlrun rerun=<run id>``)."""

from __future__ import annotations

import functools
import os
import platform
import re
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from rlrun.core.liveness import process_start

MAX_PARAM_VALUE = 6000  # MLflow's param value length limit (characters)
MAX_PARAM_KEY = 250


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 1}}`` -> ``{"algo.lr": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


# how a run was launched, not what it computes: tagged (rlrun.<key>) instead of logged as params
BOOKKEEPING = ("output_dir", "progress", "torch_threads")


def params_from_config(cfg: Mapping[str, Any]) -> dict[str, str]:
    """Flattened config as MLflow params (bookkeeping keys left out), cut to MLflow's length limits."""
    out = {}
    for k, v in flatten({k: v for k, v in cfg.items() if k not in BOOKKEEPING}).items():
        s = "null" if v is None else str(v)
        if len(s) > MAX_PARAM_VALUE:
            s = s[: MAX_PARAM_VALUE - 3] + "..."
        out[_PARAM_KEY_CHARS.sub("_", k)[:MAX_PARAM_KEY]] = s  # e.g. multiagent.policy_mapping.agent_[02]
    return out


_PARAM_KEY_CHARS = re.compile(r"[^\w\-. :/]")  # what MLflow allows in a param name


def git_sha(cwd: str | Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def version_tags() -> dict[str, str]:
    return dict(_version_tags())


@functools.lru_cache(maxsize=1)
def _version_tags() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {"python": sys.version.split()[0]}
    for pkg in ("rlrun", "torch", "gymnasium", "numpy", "mlflow", "hydra-core"):
        try:
            tags[f"version.{pkg}"] = version(pkg)
        except PackageNotFoundError:
            tags[f"version.{pkg}"] = "not installed"
    return tags


def process_tags() -> dict[str, str]:
    """Which process runs this MLflow run: host, pid and the pid's start time (Linux: clock ticks
    since boot), so a later run can tell a live run from one whose process is gone (pid reuse too)."""
    import os
    import socket

    return {"rlrun.host": socket.gethostname(), "rlrun.pid": str(os.getpid()),
            "rlrun.pid_start": process_start(os.getpid()) or ""}


RECORD_DIR = "provenance"  # in the run's output dir and among its MLflow artifacts
PACKAGES_FILE = "requirements.txt"
PATCH_FILE = "git.patch"
PLUGINS_DIR = "plugins"
PATCH_CAP = 1_000_000  # bytes of a dirty tree's patch kept (a cut patch is said in the rlrun.git_patch tag)
SOURCES_CAP = 1_000_000  # bytes of plugin sources kept per run


class GitState(NamedTuple):
    sha: str  # "unknown" outside a git work tree
    dirty: bool | None  # uncommitted changes to tracked files (None: not a git work tree)
    patch: bytes = b""  # ``git diff HEAD --binary`` of those changes (paths from the repository's root)


def git_state(cwd: str | Path) -> GitState:
    """HEAD and the dirty flag from one ``git status``; the patch (one ``git diff``) only when dirty."""
    try:
        st = subprocess.run(["git", "status", "--porcelain=v2", "--branch", "--untracked-files=no"], cwd=cwd,
                            capture_output=True, timeout=10, check=False)
        if st.returncode != 0:
            return GitState("unknown", None)
        lines = st.stdout.decode(errors="replace").splitlines()
        sha = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ")), "unknown")
        if not any(not ln.startswith("#") for ln in lines):
            return GitState(sha, False)
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=cwd, capture_output=True, timeout=30,
                              check=False)
        return GitState(sha, True, diff.stdout)
    except (OSError, subprocess.SubprocessError):
        return GitState("unknown", None)


def installed_packages() -> list[str]:
    """``name==version`` of every distribution on ``sys.path``, from the ``*.dist-info`` directory names
    (normalised names, e.g. ``hydra_core``). 1 ms here, where ``importlib.metadata.distributions()``, which
    reads every METADATA file, took 400 ms (253 distributions, 2026-11-27)."""
    found: set[str] = set()
    for entry in sys.path:
        try:
            it = os.scandir(entry or ".")
        except OSError:
            continue
        with it:
            for e in it:
                stem, dot, kind = e.name.rpartition(".")
                if dot and kind in ("dist-info", "egg-info"):
                    name, _, version = stem.partition("-")
                    found.add(f"{name}=={version}")
    return sorted(found, key=str.lower)


def plugin_files(modules: Sequence[str]) -> dict[str, tuple[Path | None, list[Path]]]:
    """The source files of imported plugin modules that live outside the installed packages (a
    package's every ``.py``, with the package's directory), by module name; modules installed in
    site-packages are in the package list instead."""
    installed = {Path(p).resolve() for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                              sys.prefix, sys.base_prefix)}
    ours = Path(__file__).resolve().parents[1]  # the rlrun package
    out: dict[str, tuple[Path | None, list[Path]]] = {}
    for mod in modules:
        file = getattr(sys.modules.get(mod), "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if path.is_relative_to(ours) or any(path.is_relative_to(d) for d in installed):
            continue
        out[mod] = (path.parent, sorted(path.parent.rglob("*.py"))) if path.name == "__init__.py" else (None, [path])
    return out


def plugin_sources(modules: Sequence[str], with_left: bool = False) -> Any:
    """The plugin sources a record keeps, ``{<module>.py or <package>/<path>: bytes}``, up to ``SOURCES_CAP``
    bytes in all; ``with_left``: also the files over the cap, ``(sources, [paths left out])``."""
    sources: dict[str, bytes] = {}
    left: list[str] = []
    budget = SOURCES_CAP
    for mod, (package, files) in plugin_files(modules).items():
        for f in files:
            data = f.read_bytes()
            if len(data) > budget:
                left.append(str(f))
                continue
            budget -= len(data)
            sources[f"{mod}/{f.relative_to(package)}" if package else f"{mod}.py"] = data
    return (sources, left) if with_left else sources


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def write_record(record_dir: Path, git: GitState, plugins: Sequence[str]) -> dict[str, str]:
    """Write the run's provenance files into ``record_dir`` (packages, the dirty patch, plugin sources);
    return the tags that say what they hold."""
    record_dir.mkdir(parents=True, exist_ok=True)
    packages = installed_packages()
    (record_dir / PACKAGES_FILE).write_text("\n".join(packages) + "\n")
    tags = {"rlrun.git_dirty": "unknown" if git.dirty is None else str(git.dirty).lower(),
            "rlrun.packages": f"{len(packages)} in {RECORD_DIR}/{PACKAGES_FILE}",
            "rlrun.platform": platform.platform(), "rlrun.cpu": cpu_model(),
            "rlrun.command": command_line()}
    if git.dirty:
        (record_dir / PATCH_FILE).write_bytes(git.patch[:PATCH_CAP])
        cut = f", cut at {PATCH_CAP:,} bytes: it will not apply whole" if len(git.patch) > PATCH_CAP else ""
        tags["rlrun.git_patch"] = f"{RECORD_DIR}/{PATCH_FILE}: {len(git.patch):,} bytes{cut}"
    sources, left = plugin_sources(plugins, with_left=True)
    for rel, data in sources.items():
        dest = record_dir / PLUGINS_DIR / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    if sources or left:
        tags["rlrun.plugin_sources"] = (", ".join(f"{RECORD_DIR}/{PLUGINS_DIR}/{r}" for r in sources) + (
            f"; over the {SOURCES_CAP:,}-byte cap, not kept: {', '.join(left)}" if left else ""))[:5000]
    return tags


def command_line() -> str:
    """The process's command line as typed (``rlrun ...`` for the console script and ``python -m rlrun``)."""
    first = Path(sys.argv[0]).name if sys.argv else ""
    argv = ["rlrun", *sys.argv[1:]] if first in ("rlrun", "__main__.py", "cli.py") else list(sys.argv)
    return shlex.join(argv)[:5000]
