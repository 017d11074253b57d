"""The package's modules import one another without a cycle, type-only imports (under
`if TYPE_CHECKING:`) included; imports inside functions are the way to defer one."""

from __future__ import annotations

import ast
from pathlib import Path

import causaldim

ROOT = Path(causaldim.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):  # if TYPE_CHECKING: ...
            found += [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in top_level_imports(path):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                targets = [target] + [f"{target}.{a.name}" for a in node.names]
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    assert cycle(import_graph()) is None, " -> ".join(cycle(import_graph()) or [])


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    graph = import_graph()
    assert "causaldim.config" in graph["causaldim.controls"]  # the registry's names
    assert "causaldim.controls" not in graph["causaldim.config"]
