"""The code contracts of ``alphafeat/`` and ``alphamodel/`` (issue 38): their tables and one
checker per rule, each returning one line per breach (``[]`` when the rule holds).

- :func:`cycles`: no import cycle inside a package, among its modules and among the children of
  each of its packages (a subpackage standing for all its modules); grimp's import graph
  (:func:`import_graph`), lazy imports inside functions included.
- :func:`layer_violations`: modules import their own layer and those before it, never a later
  one (:data:`ALPHAFEAT_LAYERS`, :data:`PRECOMPUTE_LAYERS`, :data:`ALPHAMODEL_LAYERS`).
- :func:`private_imports`: no import of another module's private (``_name``) names, save
  :data:`PRIVATE_ALLOWED`.
- :func:`long_code`: no file over 800 lines and no function over 80, save :data:`LONG_ALLOWED`.

An allow-list entry that no longer applies is a breach too (remove it). ``tests/test_layers.py``
holds both packages to these and shows each checker failing on planted code.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

import grimp
import networkx as nx

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
    ("alphamodel.cli",),
)


#: alphafeat's layers, lowest first (as :data:`ALPHAMODEL_LAYERS`; ``alphafeat/__init__.py``
#: lists them too). Names not yet in the package (``sources``) hold the places of modules on
#: their way in from other branches.
ALPHAFEAT_LAYERS: tuple[tuple[str, ...], ...] = (
    ("alphafeat.errors", "alphafeat.types", "alphafeat.cores", "alphafeat.arena", "alphafeat.zstd_frames",
     "alphafeat._command"),
    ("alphafeat.validation", "alphafeat.options"),
    ("alphafeat.dbn", "alphafeat.kept", "alphafeat.cache", "alphafeat.splits"),
    ("alphafeat.instruments", "alphafeat.book", "alphafeat.bars"),
    ("alphafeat.features",),
    ("alphafeat.cuda",),
    ("alphafeat.labels", "alphafeat.devices"),
    ("alphafeat.plan", "alphafeat.plan_scan", "alphafeat.sources", "alphafeat.inspection"),
    ("alphafeat.precompute",),
    ("alphafeat.synth",),
    ("alphafeat.commandline", "alphafeat.cli"),
)

#: The layers inside ``alphafeat/precompute/``, lowest first.
PRECOMPUTE_LAYERS: tuple[tuple[str, ...], ...] = tuple(
    (f"alphafeat.precompute.{m}",)
    for m in ("config", "job", "books", "table", "relabel", "segment", "workers", "manifest", "run")
)

_KERNEL = "a numba kernel: one compiled hot loop; splitting it into called kernels changes what LLVM " \
          "inlines and vectorises, so it needs a timing check on the measured hosts (not done here)"  # fmt: skip
_ONE_FILE = "numba kernels that call one another: numba's cache checks only the source file of the function " \
            "it compiles, so a caller in another file would run a callee's stale machine code after an edit of " \
            "the callee's file alone (numba 0.68.1, tried)"  # fmt: skip

#: ``path`` (a file) or ``path:qualname`` (a function, from its ``def`` line) -> why it may be
#: longer than :func:`long_code`'s limits.
LONG_ALLOWED: dict[str, str] = {
    "alphafeat/book.py:_rebuild_mbo": _KERNEL,
    "alphafeat/features/_rows.py:rowwise_row": _KERNEL + " (the row code shared with the CUDA kernel)",
    "alphafeat/features/cpu_kernels.py:_rowwise_block": _KERNEL,
    "alphafeat/features/cpu_kernels.py:_scan_block": _KERNEL,
    "alphafeat/synth/kernels.py:simulate": _KERNEL,
    "alphafeat/features/cpu_kernels.py": _ONE_FILE,
    "alphafeat/synth/kernels.py": _ONE_FILE,
    "alphafeat/cuda/kernels.py": "the CUDA kernels and their launch code, one device module; to split with "
                                 "the GPU at hand (CUDA tests need a GPU or the slow simulator)",
    "alphafeat/cuda/kernels.py:submit_features": "one launch sequence of the CUDA features (copies, kernels, "
                                                 "events in stream order); to split with the GPU at hand",
    "alphafeat/features/registry.py:_build": "the registry's declarations: one entry per feature, read as a table",
    "alphafeat/synth/generate.py:generate": "the generator's entry point: its 15 options and their documentation "
                                            "(60 lines) are most of it",
    "alphafeat/synth/report.py:stylised_facts": "a list of stylised facts, each a few lines of measurement",
    "alphamodel/ops/triton/passive_triton.py:passive_kernel": "a Triton kernel: one program's loop over the "
        "stride's rows with ~40 state values in registers (their loads and stores are half of it); split into "
        "jit helpers returning tuples of them only with a GPU at hand to check the compiled kernel (issue 39)",
}

#: ``path:module._name`` -> why that file imports another module's private name.
PRIVATE_ALLOWED: dict[str, str] = {}


def import_graph(*packages: str) -> grimp.ImportGraph:
    """The import graph of ``packages`` (importable from ``sys.path``; every import statement
    counts, inside functions too), built without grimp's on-disk cache."""
    return grimp.build_graph(*packages, cache_dir=None)


def _components(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node or of a node importing itself."""
    g = nx.DiGraph()
    g.add_nodes_from(edges)
    g.add_edges_from((a, b) for a, bs in edges.items() for b in bs)
    return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1 or g.has_edge(*[*c] * 2)]


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Every import cycle inside ``package``: among its modules, and, for each package in it,
    among that package's children (a subpackage standing for all its modules). Each cycle is
    the sorted names of one strongly connected component; sorted; none: ``[]``."""
    modules = {package} | graph.find_descendants(package)
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    found = _components(edges)
    for parent in sorted(modules):
        children = graph.find_children(parent)
        owner = {c: c for c in children}
        for c in children:
            owner.update(dict.fromkeys(graph.find_descendants(c), c))
        up: dict[str, set[str]] = {c: set() for c in children}
        for m, c in owner.items():
            up[c] |= {owner[i] for i in edges[m] if i in owner and owner[i] != c}
        found += [comp for comp in _components(up) if comp not in found]
    return sorted(found)


def _layer_of(module: str, layers: Sequence[Sequence[str]]) -> int | None:
    for k, names in enumerate(layers):
        if any(module == n or module.startswith(n + ".") for n in names):
            return k
    return None


def layer_violations(graph: grimp.ImportGraph, package: str, layers: Sequence[Sequence[str]]) -> list[str]:
    """Each import of a module of ``package`` that goes up the ``layers`` (lowest first), as
    ``"importer (line N) imports imported, of a later layer"``, and each module of ``package`` in
    no layer (``package`` itself excepted); none: ``[]``. Imports of modules in no layer (outside
    ``package``) are not judged."""
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


def _files(package: str) -> tuple[Path, list[Path]]:
    """The folder ``package``'s top-level name lies in, and the ``.py`` files of ``package``."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, package
    root = Path(spec.origin).parent
    return root.parents[package.count(".")], sorted(root.rglob("*.py"))


def _checked(found: Mapping[str, str], allowed: Mapping[str, str], prefix: str, what: str) -> list[str]:
    """``found`` (key -> line) not in ``allowed``, then the keys of ``allowed`` under ``prefix``
    not found (stale entries)."""
    stale = [f"{k}: listed, but {what} (remove it)" for k in sorted(allowed) if k.startswith(prefix) and k not in found]
    return [line for k, line in sorted(found.items()) if k not in allowed] + stale


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _private_uses(tree: ast.Module, me: str, package: str) -> dict[str, int]:
    """``owner._name`` -> first line of each use in ``tree`` (the code of module ``me`` of
    ``package``: ``me`` itself for a package's ``__init__``, else its parent) of a
    private name of a module of ``me``'s top-level package that ``me`` is not inside:
    ``from M import _x``, ``import a._m.b``, and ``m._x`` / ``m.a._x`` where ``m`` is a name
    bound by an import. A package's private names and modules belong to everything inside it."""
    found: dict[str, int] = {}
    bound: dict[str, str] = {}  # local name -> the dotted name it was imported as

    def note(dotted: str, line: int) -> None:
        parts = dotted.split(".")
        if parts[0] != me.split(".")[0]:
            return
        for i in range(1, len(parts)):
            inside = ".".join(parts[:i])
            if _private(parts[i]) and not (me == inside or me.startswith(inside + ".")):
                found.setdefault(".".join(parts[: i + 1]), line)
                return

    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module != "__future__":
            base = n.module or ""
            if n.level:
                base = ".".join(package.split(".")[: package.count(".") + 2 - n.level] + ([base] if base else []))
            for a in n.names:
                note(f"{base}.{a.name}", n.lineno)
                bound[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(n, ast.Import):
            for a in n.names:
                note(a.name, n.lineno)
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and _private(n.attr) and (chain := _dotted(n)) and chain[0] in bound:
            note(".".join([bound[chain[0]], *chain[1:]]), n.lineno)
    return found


def private_imports(package: str, allowed: Mapping[str, str] = PRIVATE_ALLOWED) -> list[str]:
    """Each use in ``package`` (importable from ``sys.path``) of another module's private name
    (:func:`_private_uses`: a package's private names and modules are shared by everything inside
    it) not in ``allowed``, as ``"path:line imports module._name"``; then each entry
    of ``allowed`` under ``package`` no longer found. Keys: ``path:module._name``."""
    base, files = _files(package)
    found = {}
    for f in files:
        rel = f.relative_to(base).as_posix()
        me = ".".join(f.relative_to(base).with_suffix("").parts).removesuffix(".__init__")
        home = me if f.stem == "__init__" else me.rsplit(".", 1)[0]
        for name, line in _private_uses(ast.parse(f.read_text(), str(f)), me, home).items():
            found[f"{rel}:{name}"] = f"{rel}:{line} imports {name}"
    return _checked(found, allowed, package.replace(".", "/") + "/", "imported no more")


def _function_lines(node: ast.AST, rel: str, prefix: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                out[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
            _function_lines(child, rel, f"{name}.", out)


def long_code(package: str, allowed: Mapping[str, str] = LONG_ALLOWED, max_function: int = 80,
              max_file: int = 800) -> list[str]:  # fmt: skip
    """Each file of ``package`` over ``max_file`` lines and each function (nested ones and
    methods too, counted from the ``def`` line) over ``max_function`` not in ``allowed``, as
    ``"path:qualname N lines"``; then each entry of ``allowed`` under ``package`` that is no
    longer over its limit. Keys: ``path`` (a file) or ``path:qualname``."""
    base, files = _files(package)
    sizes: dict[str, int] = {}
    for f in files:
        rel = f.relative_to(base).as_posix()
        text = f.read_text()
        sizes[rel] = text.count("\n")
        _function_lines(ast.parse(text, str(f)), rel, "", sizes)
    over = {k: f"{k} {n} lines" for k, n in sizes.items() if n > (max_function if ":" in k else max_file)}
    return _checked(over, allowed, package.replace(".", "/") + "/", "not over the limit")
