"""Short rooms: no file of ``alphafeat/`` or ``alphamodel/`` over 800 lines and no function over
80, save those listed in :data:`ALLOWED` with a reason each; and no module of ``alphafeat/``
imports another module's private (``_name``) names, save :data:`PRIVATE_ALLOWED`; the modules of
``alphafeat/precompute/`` import only downward (:data:`PRECOMPUTE_LAYERS`).

The lists must stay current: an entry that is no longer over its limit fails too (remove it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80

_KERNEL = "a numba kernel: one compiled hot loop; splitting it into called kernels changes what LLVM " \
          "inlines and vectorises, so it needs a timing check on the measured hosts (not done here)"  # fmt: skip
_ONE_FILE = "numba kernels that call one another: numba's cache checks only the source file of the function " \
            "it compiles, so a caller in another file would run a callee's stale machine code after an edit of " \
            "the callee's file alone (numba 0.68.1, tried)"  # fmt: skip
_PARALLEL = "features' private row code, shared with the CUDA kernels and the labels; features/ is edited " \
            "in parallel (issue 38): made public at that merge"  # fmt: skip

#: ``path`` (a file) or ``path:qualname`` (a function) -> why it may be longer.
ALLOWED: dict[str, str] = {
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
    "alphafeat/plan.py": "edited in parallel (mixed schemas, issue 38's other helper); to split after that merge",
    "alphafeat/plan.py:_make_plan": "edited in parallel (mixed schemas); to split after that merge",
    "alphafeat/synth/generate.py:generate": "the generator's entry point: its 15 options and their documentation "
                                            "(60 lines) are most of it",
    "alphafeat/synth/report.py:stylised_facts": "a list of stylised facts, each a few lines of measurement",
    "alphafeat/synth/simulator.py:_simulate_instrument": "one instrument's buffers, parameters and kernel call; "
                                                         "to split into steps",
}

#: ``path:module._name`` -> why that module imports another's private name.
PRIVATE_ALLOWED: dict[str, str] = {
    "alphafeat/labels.py:alphafeat.features._twin": _PARALLEL,
    "alphafeat/cuda/kernels.py:alphafeat.features._twin": _PARALLEL,
    "alphafeat/cuda/kernels.py:alphafeat.features._declared": _PARALLEL,
}


def sizes(root: Path, packages: tuple[str, ...]) -> dict[str, int]:
    """Lines of every ``.py`` file (``path``) and function (``path:qualname``) under ``packages``."""
    out: dict[str, int] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text()
            out[rel] = text.count("\n")
            _functions(ast.parse(text), rel, "", out)
    return out


def _functions(node: ast.AST, rel: str, prefix: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                out[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
            _functions(child, rel, f"{name}.", out)


def too_long(found: dict[str, int]) -> dict[str, int]:
    """The files and functions of ``found`` over their limit."""
    return {k: n for k, n in found.items() if n > (MAX_FUNCTION_LINES if ":" in k else MAX_FILE_LINES)}


def private_imports(root: Path, package: str) -> set[str]:
    """``path:name`` of every import under ``package`` of another module's private (``_x``) name:
    ``from m import _x``, ``m._x`` where ``m`` is an imported module, and a private module
    (``pkg._mod``) imported from outside its package ``pkg``."""
    out: set[str] = set()
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        here = ".".join(path.relative_to(root).with_suffix("").parts[:-1])  # the importing file's package
        tree = ast.parse(path.read_text())
        modules: dict[str, str] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and not n.level:
                for a in n.names:
                    if _private(a.name) and not (n.module == here and path.stem != "__init__"):
                        out.add(f"{rel}:{n.module}.{a.name}")
                    modules[a.asname or a.name] = f"{n.module}.{a.name}"
                _outside(n.module, here, rel, out)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    _outside(a.name, here, rel, out)
                    modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and _private(n.attr):
                mod = modules.get(n.value.id, "")
                if mod.split(".")[0] in ("alphafeat", "alphamodel"):
                    out.add(f"{rel}:{mod}.{n.attr}")
    return out


def _outside(module: str, here: str, rel: str, out: set[str]) -> None:
    """Note ``module`` when a private part of it (``pkg._mod``) is imported from outside ``pkg``."""
    parts = module.split(".")
    for i, p in enumerate(parts):
        if _private(p) and not (here + ".").startswith(".".join(parts[:i]) + "."):
            out.add(f"{rel}:{'.'.join(parts[: i + 1])}")
            return


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_files_and_functions_are_short() -> None:
    over = too_long(sizes(ROOT, ("alphafeat", "alphamodel")))
    new = {k: n for k, n in over.items() if k not in ALLOWED}
    assert not new, f"over {MAX_FILE_LINES} lines (file) or {MAX_FUNCTION_LINES} (function), not in ALLOWED: {new}"
    stale = sorted(set(ALLOWED) - set(over))
    assert not stale, f"no longer over the limit (remove from ALLOWED): {stale}"


def test_no_private_names_imported_across_modules() -> None:
    found = private_imports(ROOT, "alphafeat")
    new = sorted(found - set(PRIVATE_ALLOWED))
    assert not new, f"imports of another module's private names: {new}"
    stale = sorted(set(PRIVATE_ALLOWED) - found)
    assert not stale, f"no longer imported (remove from PRIVATE_ALLOWED): {stale}"


def test_the_checks_catch_what_they_check(tmp_path: Path) -> None:
    """A planted long function, long method, long file and private import are found; short ones are not."""
    pkg = tmp_path / "alphafeat"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    deeper = body.replace("\n", "\n    ")
    (pkg / "a.py").write_text(f"def ok():\n{body}\n\n\nclass C:\n    @staticmethod\n    def long():\n    {deeper}\n"
                              f"        y = 1\n")  # fmt: skip
    (pkg / "b.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (pkg / "sub").mkdir()
    (pkg / "sub" / "c.py").write_text("from alphafeat.a import _hidden\nimport alphafeat.a as a\nz = a._other\n"
                                      "from alphafeat.other._private import thing\nfrom alphafeat.sub import _mine\n")
    found = too_long(sizes(tmp_path, ("alphafeat",)))
    assert found == {"alphafeat/a.py:C.long": MAX_FUNCTION_LINES + 1, "alphafeat/b.py": MAX_FILE_LINES + 1}
    assert private_imports(tmp_path, "alphafeat") == {"alphafeat/sub/c.py:alphafeat.a._hidden",
                                                      "alphafeat/sub/c.py:alphafeat.a._other",
                                                      "alphafeat/sub/c.py:alphafeat.other._private"}  # fmt: skip


#: The layers of alphafeat/precompute/, lowest first: each module imports only those before it.
PRECOMPUTE_LAYERS = ("config", "job", "books", "table", "relabel", "segment", "workers", "manifest", "run")


def upward_imports(root: Path, package: str, layers: tuple[str, ...]) -> list[str]:
    """``module -> module`` for every import (lazy ones too) of a module of ``package`` (dotted) from
    a layer that is not below it in ``layers``; an unlisted module of the package too."""
    pkg_dir = root / package.replace(".", "/")
    bad = []
    for path in sorted(pkg_dir.glob("*.py")):
        if path.stem == "__init__":
            continue
        if path.stem not in layers:
            bad.append(f"{path.stem}: not in the layers")
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(n, ast.ImportFrom) and n.module and not n.level:
                names = [n.module] if n.module != package else [f"{package}.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            for name in names:
                if name.startswith(package + "."):
                    dep = name[len(package) + 1 :].split(".")[0]
                    if dep not in layers or layers.index(dep) >= layers.index(path.stem):
                        bad.append(f"{path.stem} -> {dep}")
    return bad


def test_precompute_imports_only_downward(tmp_path: Path) -> None:
    assert upward_imports(ROOT, "alphafeat.precompute", PRECOMPUTE_LAYERS) == []
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "low.py").write_text("def f():\n    from p.high import g\n")
    (pkg / "high.py").write_text("from p import low\n")
    (pkg / "stray.py").write_text("")
    assert upward_imports(tmp_path, "p", ("low", "high")) == ["low -> high", "stray: not in the layers"]
