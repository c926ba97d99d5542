"""tether's import graph, read from the source with ``ast``: no cycle, and the layers import downwards only.

Every import counts, inside functions too (a function-level import is how a cycle hides), except those under
``if TYPE_CHECKING:`` (annotations only, never executed). Importing ``a.b.c`` from outside the package ``a.b`` runs
``a/b/__init__.py`` first, so it is an edge to ``a.b`` as well.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tether"

# Edges that close a cycle today and that a change under way removes; each must still exist (a stale entry fails),
# so the list only shrinks. Issue 23: "the validation code lives outside config.py so that config.py imports
# nothing above it" (the checks module).
PENDING: dict[tuple[str, str], str] = {}  # (module, import) edges allowed until the change named lands


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(tree: ast.AST, package: str, annotations: bool = False) -> Iterator[tuple[str, int]]:
    """Every absolute module name imported in ``tree`` (``from m import x`` gives ``m.x`` and ``m``), with its line,
    skipping ``if TYPE_CHECKING:`` bodies unless ``annotations``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not annotations:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            yield base, node.lineno
            yield from ((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = ROOT, annotations: bool = False) -> dict[str, dict[str, int]]:
    """Module -> {imported module of the same package: first line}; with ``annotations``, the imports under
    ``if TYPE_CHECKING:`` count too."""
    files = module_files(root)

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for name, line in _imported_names(ast.parse(path.read_text()), package, annotations):
            target = known(name)
            if target is None or target == module:
                continue
            parts = target.split(".")
            for depth in range(2, len(parts) + 1):  # the packages whose __init__ runs first, then the module
                prefix = ".".join(parts[:depth])
                if prefix in files and prefix != module and not module.startswith(prefix + "."):
                    edges.setdefault(prefix, line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph()


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_imports_and_parent_packages(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
                              "def f():\n    from pkg.sub import c\n")
    (pkg / "b.py").write_text("from . import a\n")
    (pkg / "sub" / "c.py").write_text("import pkg.b\n")
    g = import_graph(pkg)
    assert g["pkg.a"] == {"pkg.sub": 5, "pkg.sub.c": 5}  # the TYPE_CHECKING import is no edge
    assert import_graph(pkg, annotations=True)["pkg.a"] == {"pkg.b": 3, "pkg.sub": 5, "pkg.sub.c": 5}
    assert g["pkg.b"] == {"pkg.a": 1} and g["pkg.sub.c"] == {"pkg.b": 1}


def test_tether_has_no_import_cycle(graph):
    edges = {m: {t for t in targets if (m, t) not in PENDING} for m, targets in graph.items()}
    found = cycles(edges)
    files = module_files()
    lines = [f"{m} -> {t} ({files[m].relative_to(ROOT.parent)}:{graph[m][t]})"
             for component in found for m in component for t in sorted(edges[m]) if t in component]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_pending_edges_still_exist(graph):
    """Remove an entry of PENDING once the change it names has landed."""
    assert [edge for edge in PENDING if edge[1] not in graph.get(edge[0], {})] == []


@pytest.mark.parametrize("layer, allowed", [
    ("tether.algos", ("tether.algos", "tether.registry")),  # pure math, registered by name
    ("tether.registry", ()),              # the one registry shape
    ("tether.errors", ()),                # the errors and exit codes every layer raises
    ("tether.config", ("tether.errors", "tether.config.")),  # the schema every layer reads (its modules, below)
    ("tether.seeding", ()),               # the one seed formula
])
def test_the_bottom_layers_import_nothing_above_them(graph, layer, allowed):
    above = sorted((m, t) for m, targets in graph.items() if m == layer or m.startswith(layer + ".")
                   for t in targets if not t.startswith(allowed) and (m, t) not in PENDING)
    assert above == []


def test_methods_import_neither_the_trainer_nor_the_recipes(graph):
    """Multi-stage runs live in tether.recipes, above the trainer and the methods (issue 23)."""
    upward = sorted((m, t) for m, targets in graph.items() if m.startswith("tether.methods")
                    for t in targets if t.startswith(("tether.trainer", "tether.recipes")))
    assert upward == []


@pytest.mark.parametrize("layer", ["tether.rollout", "tether.health"])
def test_collectors_and_health_checks_never_see_the_trainer_or_the_methods(layer):
    """The trainer calls them and nothing calls back (issue 37): a collector gets the engine, the step's seeds and
    the methods' generation hooks (tether.rollout.base); the health monitor wraps the engine it is given. Not even an
    annotation names the trainer, the methods or the recipes."""
    graph = import_graph(annotations=True)
    upward = sorted((m, t) for m, targets in graph.items() if m == layer or m.startswith(layer + ".")
                    for t in targets if t.startswith(("tether.trainer", "tether.methods", "tether.recipes")))
    assert upward == []


def test_envs_never_see_the_rollout_the_methods_or_the_trainer(graph):
    """Envs report facts in their infos and declare optional attributes; methods read those (issue 37), so no env
    imports a layer above it."""
    upward = sorted((m, t) for m, targets in graph.items() if m.startswith("tether.envs")
                    for t in targets if t.startswith(("tether.rollout", "tether.methods", "tether.trainer",
                                                      "tether.recipes")))
    assert upward == []
