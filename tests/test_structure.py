"""Guards for the code's shape: no import cycles (imports inside functions included), short
functions, and few ``type: ignore``s. Pure ``ast`` reading of ``rlrun/``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rlrun"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400
MAX_TYPE_IGNORES = 10  # issue 10 started from 27


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The rlrun module ``name`` refers to (``rlrun.x.Y`` -> ``rlrun.x``), or None outside rlrun."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> rlrun modules it imports anywhere in its body (top level, functions, methods).

    ``from rlrun import run`` counts as importing ``rlrun.app.runner`` (the lazy export resolves to it). A
    package's ``__init__`` being imported first by Python is not counted as an edge: it is not a
    dependency the code chose."""
    known = _modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base]) if base else ".".join(anchor)
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                if not t.startswith("rlrun"):
                    continue
                r = _resolve(t, known)
                if r == "rlrun" and t != "rlrun":  # `from rlrun import X`: the module X is exported from
                    r = _lazy_export(t.split(".")[1], known) or r
                if r and r != mod:
                    graph[mod].add(r)
    return graph


def _lazy_export(name: str, known: dict[str, Path]) -> str | None:
    if f"rlrun.{name}" in known:
        return f"rlrun.{name}"
    tree = ast.parse((ROOT / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == name and isinstance(v, ast.Constant):
                    return str(v.value)
    return None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_cycle_finder_finds_a_lazy_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_rlrun() -> None:
    graph = import_graph()
    assert "rlrun.core.registry" in graph and graph["rlrun.app.runner"], "the graph reader found no imports"
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (counting imports inside functions): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_registry_is_a_leaf() -> None:
    assert import_graph()["rlrun.core.registry"] <= {"rlrun.core.errors", "rlrun.suggest"}


@pytest.mark.parametrize("limit", [MAX_FUNCTION_LINES])
def test_no_function_in_rlrun_is_longer_than_the_limit(limit: int) -> None:
    too_long = long_functions(limit)
    assert not too_long, f"functions longer than {limit} lines:\n" + "\n".join(too_long)


def test_no_module_in_rlrun_is_longer_than_the_limit() -> None:
    too_long = [f"{p.relative_to(ROOT.parent)}: {n} lines" for p in sorted(ROOT.rglob("*.py"))
                if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not too_long, f"modules longer than {MAX_MODULE_LINES} lines:\n" + "\n".join(too_long)


def test_type_ignores_stay_few() -> None:
    count = sum(p.read_text().count("type: ignore") for p in ROOT.rglob("*.py"))
    assert count <= MAX_TYPE_IGNORES, f"{count} 'type: ignore' comments in rlrun/ (at most {MAX_TYPE_IGNORES})"


def test_every_public_name_is_what_it_says_not_a_shadowing_submodule() -> None:
    # ``from rlrun import make_trainer, run``: importing make_trainer loads its module; a submodule named
    # like an export would then shadow the lazy export (``run`` was once the module ``rlrun.run``)
    import subprocess
    import sys

    code = ("import rlrun, types; from rlrun import make_trainer; names = rlrun.__all__; "
            "bad = [n for n in names if isinstance(getattr(rlrun, n), types.ModuleType)]; print(bad)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
