"""Import contracts, checked on grimp's import graph (``grimp.build_graph``): no import cycles
inside a package, at the level of its modules and at the level of each package's children
(:func:`cycles`), and layers that import downward only (:func:`layer_violations`); and, on the
source, no import of another module's private names (:func:`private_imports`) and no long
function or file (:func:`long_code`).

Used by ``tests/test_layers.py``; to hold another package to its layers, add its table (like
:data:`ALPHAMODEL_LAYERS`) and a test that calls :func:`cycles` and :func:`layer_violations`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grimp

#: alphamodel's layers, lowest first: a module may import modules of its own layer and of the
#: layers before it, never of a later one (``alphamodel/__init__.py`` lists them too).
ALPHAMODEL_LAYERS: tuple[tuple[str, ...], ...] = (
    ("alphamodel.errors", "alphamodel.enums", "alphamodel.rules", "alphamodel.readout"),
    ("alphamodel.ops",),
    ("alphamodel.nn",),
    ("alphamodel.data",),
    ("alphamodel.supervised",),
    ("alphamodel.rl",),
    ("alphamodel.backtest",),
    ("alphamodel.config",),
)


def import_graph(*packages: str) -> grimp.ImportGraph:
    """The import graph of ``packages`` (importable from ``sys.path``; every import statement
    counts, inside functions too), built without grimp's on-disk cache."""
    return grimp.build_graph(*packages, cache_dir=None)


def _strongly_connected(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, or of one node importing itself
    (Tarjan, iterative), each sorted; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in edges.get(v, ()):
                    out.append(sorted(comp))
    return sorted(out)


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Every import cycle inside ``package``: among its modules, and, for each package in it,
    among that package's children (a subpackage standing for all its modules). Each cycle is
    the sorted names of one strongly connected component; none: ``[]``."""
    modules = {package} | graph.find_descendants(package)
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    found = _strongly_connected(modules, edges)
    for parent in sorted(modules):
        children = graph.find_children(parent)
        if not children:
            continue
        owner = {c: c for c in children}
        for c in children:
            owner.update(dict.fromkeys(graph.find_descendants(c), c))
        up = {c: set() for c in children}
        for m, c in owner.items():
            up[c] |= {owner[i] for i in edges[m] if i in owner and owner[i] != c}
        found += [comp for comp in _strongly_connected(children, up) if comp not in found]
    return found


def _layer_of(module: str, layers: Sequence[Sequence[str]]) -> int | None:
    for k, names in enumerate(layers):
        if any(module == n or module.startswith(n + ".") for n in names):
            return k
    return None


def layer_violations(graph: grimp.ImportGraph, package: str, layers: Sequence[Sequence[str]]) -> list[str]:
    """Each import of ``package`` that goes up the ``layers`` (lowest first), as ``"importer (line N)
    imports imported, of a later layer"``, and each module of ``package`` in no layer (the package
    itself excepted); none: ``[]``."""
    out = []
    for m in sorted(graph.find_descendants(package)):
        k = _layer_of(m, layers)
        if k is None:
            out.append(f"{m} is in no layer")
            continue
        for i in sorted(graph.find_modules_directly_imported_by(m)):
            ki = _layer_of(i, layers)
            if ki is not None and ki > k:
                lines = sorted(d["line_number"] for d in graph.get_import_details(importer=m, imported=i))
                out.append(f"{m} (line {', '.join(map(str, lines))}) imports {i}, of a later layer")
    return out


def private_imports(package: str) -> list[str]:
    """Each ``from M import _name`` in the modules of ``package`` (importable from ``sys.path``)
    that takes a private name of another module, as ``"file:line imports M._name"``; none: ``[]``.
    (An ``import M`` followed by ``M._name`` is not seen.)"""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(package)
    root = Path(next(iter(spec.submodule_search_locations))) if spec.submodule_search_locations else None
    files = sorted(root.rglob("*.py")) if root else [Path(spec.origin)]
    out = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                out += [f"{f}:{node.lineno} imports {node.module or '.'}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def long_code(package: str, max_function: int = 80, max_file: int = 800) -> list[str]:
    """Each function of ``package`` longer than ``max_function`` lines (its decorators and docstring
    included) and each file longer than ``max_file`` lines, as ``"file:line name N lines"``."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(package)
    out = []
    for f in sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.py")):
        text = f.read_text()
        if len(text.splitlines()) > max_file:
            out.append(f"{f}:1 file {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text, str(f))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - start + 1 > max_function:
                    out.append(f"{f}:{start} {node.name} {node.end_lineno - start + 1} lines")
    return out
