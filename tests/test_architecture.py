"""Architecture rules, checked on the source: neutral packages import no system, and module-level imports
have no cycle (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "medadapt"
SYSTEMS = ("medadapt.moe", "medadapt.asym", "medadapt.hyrec", "medadapt.bmretriever")
NEUTRAL = ("adapters", "cards.py", "recipes", "training", "retrieval", "data", "eval", "losses", "curation", "config.py", "cache.py", "cache_shards.py",
           "io.py", "checksums.py", "tokenizer_id.py", "errors.py", "models.py", "report", "plan", "encode.py", "backends.py", "plugins.py")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # `if TYPE_CHECKING:` blocks do not run
        nodes = [n for n in nodes if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    found = set()
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("medadapt")}


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


def test_no_import_cycle_at_module_level():
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for m in _imports(path, top_level_only=True):
            while m and m not in modules:  # `from pkg.mod import name` -> pkg.mod
                m = m.rsplit(".", 1)[0] if "." in m else ""
            if m and m != name:
                deps.add(m)
        graph[name] = deps
    # a package's __init__ importing its own submodules is not a cycle through the package
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph[node]:
            if node.startswith(dep + ".") or dep.startswith(node + "."):
                continue
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


# Deprecated aliases kept so that code and model folders written for medadapt 0.1 keep working: the MoE
# head's old home (`medadapt.heads.moe.MoEHead` in saved modules.json, `from medadapt.heads import MoEHead`).
LEGACY_ALIASES = {"medadapt/heads/moe.py", "medadapt/heads/__init__.py"}


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
