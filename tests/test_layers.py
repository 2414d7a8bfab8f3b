"""rlrun/ is a stack of layers (ARCHITECTURE.md): a module imports only from its own layer or the
layers below. Every import statement counts, function-level ones included."""

import ast
import sys
from pathlib import Path

RLRUN = Path(__file__).resolve().parents[1] / "rlrun"

# bottom to top; the package root (rlrun/__init__.py, __main__.py) sits above them all
LAYERS = ("core", "config", "data", "envs", "models", "policy", "algos", "sources", "training", "tracking", "app")
ROOT = "<root>"


def modules() -> dict[str, Path]:
    out = {}
    for p in RLRUN.rglob("*.py"):
        if "conf" in p.relative_to(RLRUN).parts[:1]:
            continue
        rel = p.relative_to(RLRUN.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else ROOT


def rank(module: str) -> int:
    name = layer(module)
    return len(LAYERS) if name == ROOT else LAYERS.index(name)


def imported(module: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) for every rlrun module (or package) that ``module`` imports."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names if a.name.split(".")[0] == "rlrun"]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - n.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "rlrun":
                continue
            for a in n.names:  # a submodule, or a name of the module (package) ``base``
                out.append((n.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base))
    return out


def upward_imports() -> list[str]:
    known = modules()
    bad = []
    for module, path in sorted(known.items()):
        for line, target in imported(module, path, known):
            if target == "rlrun" and layer(module) != ROOT:
                bad.append(f"{path.relative_to(RLRUN.parent)}:{line}: {module} imports the package root 'rlrun' "
                           "(it re-exports every layer; import from the module that defines the name)")
            elif target != "rlrun" and rank(target) > rank(module):
                bad.append(f"{path.relative_to(RLRUN.parent)}:{line}: {module} ({layer(module)}) imports {target} "
                           f"({layer(target)}), a higher layer")
    return bad


def test_every_module_is_in_a_layer():
    stray = [m for m in modules() if layer(m) == ROOT and m not in ("rlrun", "rlrun.__main__")]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"


def test_no_module_imports_from_a_higher_layer():
    bad = upward_imports()
    assert not bad, "imports that climb up the layers:\n" + "\n".join(bad)


def test_every_import_names_an_existing_module():
    """A function-level import of a module that moved away fails only when that line runs: caught here."""
    known = modules()
    missing = [f"{path.relative_to(RLRUN.parent)}:{line}: {module} imports {target}, which does not exist"
               for module, path in sorted(known.items()) for line, target in imported(module, path, known)
               if target not in known]
    assert not missing, "\n".join(missing)


def test_the_check_names_an_upward_import(tmp_path, monkeypatch):
    """The check itself can fail: an import of the app layer from core is reported with file and line."""
    fake = tmp_path / "rlrun"
    (fake / "core").mkdir(parents=True)
    (fake / "app").mkdir()
    for p in ("__init__.py", "core/__init__.py", "app/__init__.py", "app/cli.py"):
        (fake / p).write_text("")
    (fake / "core" / "errors.py").write_text("def f():\n    from rlrun.app.cli import main\n")
    monkeypatch.setattr(sys.modules[__name__], "RLRUN", fake)
    assert upward_imports() == ["rlrun/core/errors.py:2: rlrun.core.errors (core) imports rlrun.app.cli (app), "
                                "a higher layer"]
