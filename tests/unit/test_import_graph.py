"""The import graph of meshplan goes one way only, read from the source with ``ast``:

    errors, _version → spec → hardware_profiles → costmodel → planner → executor
        → calibrate | report → commands → meshplan (the package's public facade) → cli

A module may import its own package and packages of lower layers, never a higher one or
another package of its own layer (calibrate and report do not import each other). Every
import counts, module-level or inside a function (a lazy import is still a dependency),
except those under ``if TYPE_CHECKING:``: they never run, so they load no higher layer and
close no cycle at run time, and the code uses them only to name a type in annotations
(``spec/validate.py`` names the ``Cluster`` it reads that way). The facade
``meshplan/__init__.py`` (``mp.plan``, ``mp.estimate``, ...) sits above every package: inside
them ``from meshplan import X`` is allowed only where X is a module (``from meshplan import
errors``); ``__version__`` comes from ``meshplan._version``. And no two modules import each other,
directly or around a cycle, inside a package or across packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "meshplan"
LAYERS = [{"errors", "_version"}, {"spec"}, {"hardware_profiles"}, {"costmodel"},
          {"planner"}, {"executor"}, {"calibrate", "report"}, {"commands"}, {"meshplan"},
          {"cli", "__main__"}]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def package_of(module: str) -> str:
    """The top-level part of meshplan a module belongs to ("meshplan" for the facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "meshplan"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` block."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


class Graph:
    """The meshplan modules under ``pkg`` (a directory named meshplan) and their imports."""

    def __init__(self, pkg: Path = PKG):
        self.modules = {}
        for path in sorted(pkg.rglob("*.py")):
            parts = path.relative_to(pkg.parent).with_suffix("").parts
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def _resolve(self, name: str) -> str | None:
        """The meshplan module an imported name loads (its longest module prefix)."""
        while name:
            if name in self.modules:
                return name
            name = name.rpartition(".")[0]
        return None

    def imports(self, module: str) -> list[tuple[str, int, bool]]:
        """(imported meshplan module, line, under TYPE_CHECKING) for every import in
        ``module``, at any depth."""
        path = self.modules[module]
        tree = ast.parse(path.read_text(), str(path))
        guarded = _type_checking_nodes(tree)
        out = []
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:      # relative: from the module's package
                    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                # "from a.b import c": the module a.b.c where c is one, else a.b itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in self.modules else base
                           for a in node.names]
            for t in targets:
                found = self._resolve(t) if t.split(".")[0] == "meshplan" else None
                if found:
                    out.append((found, node.lineno, id(node) in guarded))
        return out

    def edges(self) -> dict[str, set[str]]:
        """Each module's imports, those under TYPE_CHECKING left out."""
        return {m: {t for t, _, guarded in self.imports(m) if not guarded}
                for m in self.modules}

    def violations(self) -> list[str]:
        out = []
        for module in self.modules:
            src = package_of(module)
            for target, line, guarded in self.imports(module):
                dst = package_of(target)
                if guarded or dst == src:
                    continue
                missing = [p for p in (src, dst) if p not in LAYER]
                if missing:
                    out.append(f"{module}:{line} imports {target}: {missing[0]!r} has no layer")
                elif LAYER[dst] >= LAYER[src]:
                    out.append(f"{module}:{line} imports {target} ({dst}, layer {LAYER[dst]}) "
                               f"from {src} (layer {LAYER[src]})")
        return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


GRAPH = Graph()


def test_every_package_has_a_layer():
    assert {package_of(m) for m in GRAPH.modules} <= set(LAYER)
    for names in LAYERS:
        for name in names - {"meshplan", "__main__"}:
            assert (PKG / name).is_dir() or (PKG / f"{name}.py").exists(), name


def test_imports_go_down_the_layers_only():
    assert GRAPH.violations() == []


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.edges().items():
        graph.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module))
    assert cycles(graph) == []


def test_no_cycle_between_modules():
    graph = {m: {t for t in targets if t != m} for m, targets in GRAPH.edges().items()}
    assert cycles(graph) == []


def test_the_checker_sees_lazy_imports_relative_imports_and_type_checking(tmp_path):
    """A function-level import upward is a violation; the same under TYPE_CHECKING is not;
    a relative import resolves to its package's module; a two-module cycle is found."""
    pkg = tmp_path / "meshplan"
    for sub in ("spec", "costmodel"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "spec" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from meshplan.costmodel import b\n"
        "def f():\n    from meshplan.costmodel.b import g\n    return g\n")
    (pkg / "costmodel" / "b.py").write_text("from . import c\ndef g():\n    pass\n")
    (pkg / "costmodel" / "c.py").write_text("from meshplan.costmodel.b import g\n")
    g = Graph(pkg)
    assert g.imports("meshplan.spec.a") == [("meshplan.costmodel.b", 3, True),
                                            ("meshplan.costmodel.b", 5, False)]
    assert g.violations() == ["meshplan.spec.a:5 imports meshplan.costmodel.b (costmodel, "
                              "layer 3) from spec (layer 1)"]
    assert g.imports("meshplan.costmodel.b") == [("meshplan.costmodel.c", 1, False)]
    assert cycles(g.edges()) == [["meshplan.costmodel.b", "meshplan.costmodel.c"]]


def test_version_comes_from_the_package_metadata():
    from importlib.metadata import PackageNotFoundError, version

    import meshplan
    from meshplan import _version
    try:
        assert meshplan.__version__ == version("meshplan")
    except PackageNotFoundError:       # a checkout run without installing: pyproject's
        assert meshplan.__version__ == _version._version() != "0+unknown"
