"""The public surface: every name a user script or plugin needs imports from ``rlrun`` itself, and
the flat layout's module paths keep working for one release, with a DeprecationWarning."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_every_public_name_imports_from_rlrun():
    p = python("import rlrun\nfor n in rlrun.__all__: getattr(rlrun, n)\nprint(len(rlrun.__all__))")
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) >= 40
    assert "DeprecationWarning" not in p.stderr, p.stderr  # the public names come from their real modules


def test_the_client_stays_light():
    p = python("import sys\nfrom rlrun import PolicyClient, RunFinished\nprint('torch' in sys.modules)")
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout + p.stderr


@pytest.mark.parametrize(("old", "name"), [
    ("rlrun.cli", "compose"), ("rlrun.client", "PolicyClient"), ("rlrun.offline", "EpisodeWriter"),
    ("rlrun.trainer", "COLLECTED_COLUMNS"), ("rlrun.workers", "RolloutWorker"), ("rlrun.batch", "SampleBatch"),
    ("rlrun.config", "RunConfig"), ("rlrun.config", "build_config"), ("rlrun.policy", "LossOutput"),
    ("rlrun.registry", "LOSSES"), ("rlrun.algorithm", "register_algorithm"),
])
def test_a_moved_name_still_imports_with_a_warning(old, name):
    p = python(f"from {old} import {name} as old\nimport importlib, rlrun\n"
               f"new = getattr(rlrun, {name!r}, None)\n"
               f"print(new is None or old is new)")
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stdout + p.stderr
    assert "DeprecationWarning" in p.stderr and "next release" in p.stderr, p.stderr


def test_an_unknown_name_on_an_old_path_is_an_attribute_error():
    p = python("from rlrun.trainer import NoSuchName")
    assert p.returncode == 1 and "NoSuchName" in p.stderr


def test_the_readme_examples_import_only_the_public_surface():
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    imports = [line.strip() for b in blocks for line in b.splitlines() if re.match(r"\s*(from|import) rlrun", line)]
    assert imports, "the README has python examples that import rlrun"
    private = [i for i in imports if not re.match(r"from rlrun import ", i)]
    assert not private, f"README examples import rlrun's internals: {private}"
