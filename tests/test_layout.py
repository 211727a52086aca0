"""The package's layout: no import circles, a size guide per module, and where each feature runs.

Read from the sources (``ast``), not by importing: an import inside a function
counts as much as one at the top, and only ``if TYPE_CHECKING:`` blocks are
left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import daskcollect

PACKAGE = Path(daskcollect.__file__).parent
ROOT = PACKAGE.name


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> set[str]:
    """The daskcollect modules that ``path`` imports (a package's submodule named in ``from pkg import x``
    counts as that submodule)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if _type_checking_only(node) for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == ROOT}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == ROOT:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                out.add(child if child in MODULES else node.module)
    return {m for m in out if m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing itself."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other_directly_or_in_a_loop():
    # A package's __init__ that re-exports its modules is imported by them as their parent, not named:
    # only explicit imports count.
    graph = {name: imports(path) - {name} for name, path in MODULES.items()}
    assert len(graph) > 40
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_each_feature_is_a_package_whose_modules_say_where_they_run():
    where = {
        "retirement": {"scheduler", "driver"},
        "reattach": {"scheduler", "driver"},
        "leases": {"scheduler", "driver"},
        "monitoring": {"scheduler", "driver", "worker"},
        "inference": {"driver", "worker"},
        "streams": {"driver", "worker"},
        "membership": {"driver"},
        "scaling": {"scheduler", "driver"},
    }
    for feature, modules in where.items():
        found = {p.stem for p in (PACKAGE / feature).glob("*.py")}
        assert modules <= found, (feature, found)
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {
        "__init__",
        "_imports",
        "collector",
        "replay_buffer",
        "errors",
        "settings",
        "testing",
        "cli",
    }
    assert (PACKAGE / "_internals" / "__init__.py").exists()  # and the fence


def test_no_module_outgrows_the_guide():
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert sizes["daskcollect.collector"] <= 450
    assert {name: n for name, n in sizes.items() if n > 650} == {}
