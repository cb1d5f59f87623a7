"""Architecture rules, checked on the source (docs/architecture.md): neutral packages import no system, the
module graph has no cycle (imports anywhere in a file count, function-level ones included, and so do modules
named in a string: lazy tables, ``importlib.import_module("medadapt.x")``), no two packages import each other,
and function-level imports of medadapt modules only ever become fewer."""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "medadapt"
SYSTEMS = ("medadapt.moe", "medadapt.care", "medadapt.hyrec", "medadapt.bmretriever")
NEUTRAL = ("adapters", "cards.py", "recipes", "training", "retrieval", "data", "eval", "losses", "curation", "config.py",
           "cache.py", "cache_shards.py", "io.py", "checksums.py", "identity.py", "tokenizer_id.py", "errors.py", "models.py",
           "model_names.py", "trust.py", "devices.py", "tiny.py", "finite.py", "locks.py", "progress.py", "yaml_input.py", "decoder.py", "report",
           "plan", "encode.py", "backends.py", "systems.py")
#: Imports of medadapt modules inside functions (hidden edges of the module graph). Lower it when you hoist one;
#: a new one fails this ceiling: import medadapt modules at module level (laziness is for optional third-party
#: packages only).
FUNCTION_LEVEL_IMPORTS_CEILING = 0


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, path: Path) -> set[str]:
    """The medadapt modules (and ``module.name`` candidates) one import statement names."""
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    elif node.level:
        package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        module = f"{base}.{node.module}" if node.module else base
        found = {module} | {f"{module}.{a.name}" for a in node.names}
    else:
        found = {node.module} | {f"{node.module}.{a.name}" for a in node.names} if node.module else set()
    return {m for m in found if m == "medadapt" or m.startswith("medadapt.")}


def _import_nodes(path: Path, top_level_only: bool) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """``(import statement, inside a function)`` for the file's imports; ``top_level_only``: those that run
    when the module is imported (``if TYPE_CHECKING:`` blocks excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if top_level_only:
        nodes = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
        return [(n, False) for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def _imports(path: Path, top_level_only: bool) -> set[str]:
    found = {m for node, _ in _import_nodes(path, top_level_only) for m in _targets(node, path)}
    return found if top_level_only else found | _named_modules(path)


_MODULE_NAME = re.compile(r"medadapt(\.\w+)+")


@functools.lru_cache(maxsize=4)
def _module_names(root: Path) -> frozenset[str]:
    return frozenset(_module_name(p) for p in root.rglob("*.py"))


def _named_modules(path: Path) -> set[str]:
    """The medadapt modules a file names in a string (``"medadapt.cli.eval"`` in a lazy table, an
    ``importlib.import_module`` argument): imported by name when used, so still edges of the module graph.
    Only whole module names count (a class path in a folder's ``modules.json`` format is data)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and _MODULE_NAME.fullmatch(n.value) and n.value in _module_names(ROOT)}


def _files(*names: str) -> list[Path]:
    out = []
    for name in names:
        p = ROOT / name
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.exists() else []
    return out


@pytest.mark.parametrize("path", _files(*NEUTRAL), ids=lambda p: str(p.relative_to(ROOT)))
def test_neutral_modules_import_no_system(path):
    bad = sorted(m for m in _imports(path, top_level_only=False) if m.startswith(SYSTEMS))
    assert not bad, f"{path.relative_to(ROOT)} imports system package(s) {bad}"


def _module_graph() -> dict[str, set[str]]:
    """Module -> the medadapt modules it imports anywhere in the file (function level, ``TYPE_CHECKING`` and
    all); a package and its own submodules are not edges of each other (``__init__`` re-exports), except a
    submodule the package names in a string (a lazy table: ``medadapt.cli`` -> ``medadapt.cli.eval``)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}

    def known(m: str) -> str:
        while m and m not in modules:  # `from pkg.mod import name` -> pkg.mod
            m = m.rsplit(".", 1)[0] if "." in m else ""
        return m

    graph = {}
    for name, path in modules.items():
        deps = set()
        for m in map(known, _imports(path, top_level_only=False)):
            if m and m != name and not (name.startswith(m + ".") or m.startswith(name + ".")):
                deps.add(m)
        for m in _named_modules(path):
            if m != name and not name.startswith(m + "."):
                deps.add(m)
        graph[name] = deps
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the strongly connected components of ``graph`` with more than one node (each one
    a cycle of imports), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_strongly_connected_finds_every_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert _strongly_connected(graph) == [["a", "b", "c"], ["d", "e"]]
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_module_graph_has_no_cycle():
    """Any cycle fails, however long and however hidden (an import inside a function is still an edge)."""
    graph = _module_graph()
    cycles = _strongly_connected(graph)
    lines = [", ".join(c) + "  [" + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) + "]"
             for c in cycles]
    assert not cycles, "import cycles (strongly connected modules, and their edges):\n" + "\n".join(lines)


def test_a_module_named_in_a_lazy_table_is_an_edge(tmp_path, monkeypatch):
    """``medadapt.cli``'s table names ``medadapt.cli.eval``: a cycle through that string fails like any other."""
    pkg = tmp_path / "medadapt"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text('COMMANDS = {"eval": ("medadapt.cli.eval", "eval_cmd", "Evaluate.")}\n')
    (pkg / "cli" / "eval.py").write_text("from medadapt.report import page\n")
    (pkg / "report.py").write_text("import importlib\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    assert _named_modules(pkg / "cli" / "__init__.py") == {"medadapt.cli.eval"}
    assert _strongly_connected(_module_graph()) == []
    (pkg / "report.py").write_text("from medadapt.cli import COMMANDS\n")  # closes the cycle through the table
    assert _strongly_connected(_module_graph()) == [["medadapt.cli", "medadapt.cli.eval", "medadapt.report"]]
    (pkg / "report.py").write_text('import importlib\nCLI = importlib.import_module("medadapt.cli")\n')
    assert _strongly_connected(_module_graph()) == [["medadapt.cli", "medadapt.cli.eval", "medadapt.report"]]


def _function_level_imports() -> list[str]:
    return [f"{path.relative_to(ROOT.parent)}:{node.lineno}" for path in sorted(ROOT.rglob("*.py"))
            for node, in_function in _import_nodes(path, top_level_only=False)
            if in_function and _targets(node, path)]


def test_function_level_imports_of_medadapt_only_go_down():
    found = _function_level_imports()
    assert len(found) <= FUNCTION_LEVEL_IMPORTS_CEILING, (
        f"{len(found)} function-level imports of medadapt modules (ceiling {FUNCTION_LEVEL_IMPORTS_CEILING}); "
        "import medadapt modules at module level. All of them:\n" + "\n".join(found))


# Aliases kept so that model folders written for medadapt 0.1 keep loading: the heads' old module paths
# (`medadapt.heads.moe.MoEHead`, `medadapt.heads.linear.*` in a saved modules.json).
LEGACY_ALIASES = {"medadapt/heads/moe.py", "medadapt/heads/linear.py", "medadapt/heads/__init__.py"}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_packages_form_no_cycle_even_through_lazy_imports():
    """Data flows one way between packages (function-level imports included): data -> encoders/heads ->
    losses/loop -> index/retriever -> eval, with recipes and the CLI on top."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = _package(_module_name(path))
        legacy = str(path.relative_to(ROOT.parent)) in LEGACY_ALIASES
        for m in _imports(path, top_level_only=False):
            if legacy and m.startswith("medadapt.moe"):
                continue
            dst = _package(m)
            if dst != src and dst != "medadapt" and src != "medadapt":
                graph.setdefault(src, set()).add(dst)
    cycles = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if a < b and a in graph.get(b, set()))
    assert not cycles, "package cycles: " + ", ".join(cycles)
