"""The packages of ``evolve`` import one another without cycles.

The import graph is read from the source with ``ast``: every ``import`` and
``from ... import`` of a module, at module level and inside functions alike
(an import hidden in a function is still a dependency), relative names
resolved. A package's ``__init__`` is a module of its own. Modules are then
collapsed to their package (``evolve.runs``, ``evolve.data``,
``evolve.data.sources``, ``evolve.kernels``, ...; a top-level module such as
``evolve.errors`` is its own node), and the graph of packages must have no
cycle. The implicit run of a parent ``__init__`` is not an edge: the parents'
``__init__`` modules import nothing of ``evolve`` at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evolve"
NESTED = ("evolve.data.sources",)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` (``evolve``) by dotted name (``pkg/__init__.py`` is
    ``pkg``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``evolve`` that ``module`` imports anywhere in its source."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    out.add(full)
                elif base in modules:
                    out.add(base)
    out.discard(module)
    return out


def package_of(module: str) -> str:
    for nested in NESTED:
        if module == nested or module.startswith(nested + "."):
            return nested
    parts = module.split(".")
    if len(parts) >= 2 and (PACKAGE / parts[1] / "__init__.py").is_file():
        return ".".join(parts[:2])
    return module


def package_graph() -> dict[str, dict[str, set[str]]]:
    """``graph[a][b]``: the modules of package ``a`` that import package ``b``."""
    modules = _modules()
    graph: dict[str, dict[str, set[str]]] = {}
    for module, path in modules.items():
        source = package_of(module)
        graph.setdefault(source, {})
        for target in _targets(module, path, modules):
            dest = package_of(target)
            if dest != source:
                graph[source].setdefault(dest, set()).add(f"{module} -> {target}")
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(graph, component: list[str]) -> str:
    inside = set(component)
    lines = [" <-> ".join(component)]
    for a in component:
        for b in sorted(graph[a]):
            if b in inside:
                lines += [f"    {edge}" for edge in sorted(graph[a][b])]
    return "\n".join(lines)


def test_the_graph_sees_relative_and_local_imports(tmp_path):
    source = ("from . import b\nfrom .sub import c\n"
              "def f():\n    import evolve.errors\n")
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {"evolve.x.mod": path, "evolve.x.b": path, "evolve.x.sub": path,
               "evolve.x.sub.c": path, "evolve.errors": path}
    assert _targets("evolve.x.mod", path, modules) == {
        "evolve.x.b", "evolve.x.sub.c", "evolve.errors"}


def test_a_cycle_is_found():
    graph = {"a": {"b": {"a.m -> b.n"}}, "b": {"c": {"b.n -> c.o"}},
             "c": {"a": {"c.o -> a.m"}}, "d": {"a": {"d -> a"}}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_package_import_cycle():
    graph = package_graph()
    assert "evolve.objectives" in graph and "evolve.kernels" in graph
    found = cycles(graph)
    assert not found, "package import cycles:\n" + "\n".join(
        _describe(graph, c) for c in found)


def test_io_imports_nothing_of_the_project_but_errors():
    modules = _modules()
    for module, path in modules.items():
        if package_of(module) == "evolve.io":
            assert _targets(module, path, modules) <= {"evolve.errors", "evolve.io",
                                                       "evolve.io.jsonio", "evolve.io.atomic",
                                                       "evolve.io.lock", "evolve.io.paths"}, module


def test_parent_init_modules_import_nothing_at_import_time():
    """Why the implicit run of a parent ``__init__`` is not an edge above."""
    for parent in ("evolve", "evolve.data"):
        path = _modules()[parent]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
        assert not top, parent


def _function_local_imports(path: Path):
    """(line number, text) of every import inside a function body of ``path``."""
    src = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(src), filename=str(path))
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node.lineno, src[node.lineno - 1], src[node.lineno - 2]


def test_every_function_local_import_says_why_it_is_lazy():
    """An import inside a function hides a dependency from a reader; each one says
    why it is there (``# lazy: <reason>`` on its line or the line above), usually
    start-up time: ``evolve --help`` and commands that evaluate nothing load
    neither Numba nor the libraries of the optional extras."""
    bare = []
    for path in sorted(list(PACKAGE.rglob("*.py")) + list((ROOT / "heuristics").rglob("*.py"))):
        for line, text, above in _function_local_imports(path):
            if "# lazy:" not in text and not above.strip().startswith("# lazy:"):
                bare.append(f"{path.relative_to(ROOT)}:{line}: {text.strip()}")
    assert not bare, "function-local imports without a '# lazy: <why>' comment:\n" + \
        "\n".join(bare)


def module_graph(package: Path = PACKAGE) -> dict[str, dict[str, set[str]]]:
    """``graph[a][b]``: module ``a`` imports module ``b`` (anywhere in its source). An
    explicit import of a module's own package (``from evolve.kernels import gpu`` in
    ``evolve.kernels.gpu.fused``) is an edge to the package's ``__init__``; only the
    implicit run of a parent ``__init__`` is not (see the module doc)."""
    modules = _modules(package)
    return {m: {t: {f"{m} -> {t}"} for t in _targets(m, p, modules)}
            for m, p in modules.items()}


def test_no_module_import_cycle():
    """Not only packages: no two modules import each other, directly or around a
    circle (a circle hides which one is built on which), a package's ``__init__`` and
    its own modules included."""
    graph = module_graph()
    assert "evolve.objectives.trace_objectives" in graph
    found = cycles(graph)
    assert not found, "module import cycles:\n" + "\n".join(_describe(graph, c) for c in found)


def test_no_benchmark_module_import_cycle():
    """The scripts of benchmarks/ import one another without a circle either (what two
    of them share lives in a third, such as ``benchmarks/speed/sizes.py``)."""
    graph = module_graph(ROOT / "benchmarks")
    assert "benchmarks.speed.harness" in graph and "benchmarks.speed.trace_speed" in graph
    found = cycles(graph)
    assert not found, "module import cycles:\n" + "\n".join(_describe(graph, c) for c in found)
