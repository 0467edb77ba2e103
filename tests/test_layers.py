"""The code contracts (issue 38; tables and checkers in ``tests/layers.py``): alphafeat and
alphamodel have no import cycle, their layers import downward only, they import no other module's
private names and have no long file or function beyond their allow-lists, alphafeat never imports
alphamodel; and each checker fails on code planted in packages made for the test."""

from __future__ import annotations

import functools

import grimp
import pytest
from layers import (
    ALPHAFEAT_LAYERS,
    ALPHAMODEL_LAYERS,
    PRECOMPUTE_LAYERS,
    cycles,
    import_graph,
    layer_violations,
    long_code,
    private_imports,
)

PACKAGES = ("alphafeat", "alphamodel")


@functools.cache
def _graph() -> grimp.ImportGraph:
    return import_graph(*PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    assert cycles(_graph(), package) == []


@pytest.mark.parametrize(("package", "layers"), [("alphafeat", ALPHAFEAT_LAYERS),
                                                 ("alphafeat.precompute", PRECOMPUTE_LAYERS),
                                                 ("alphamodel", ALPHAMODEL_LAYERS)])  # fmt: skip
def test_layers_import_downward_only(package: str, layers: tuple[tuple[str, ...], ...]) -> None:
    assert layer_violations(_graph(), package, layers) == []


def test_alphafeat_never_imports_alphamodel() -> None:
    graph = _graph()
    assert not graph.chain_exists(importer="alphafeat", imported="alphamodel", as_packages=True), \
        graph.find_shortest_chains(importer="alphafeat", imported="alphamodel")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_of_another_module_is_imported(package: str) -> None:
    assert private_imports(package) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_files_and_functions_are_short(package: str) -> None:
    assert long_code(package) == []


def _package(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_checkers_find_a_planted_cycle_and_an_upward_import(tmp_path, monkeypatch) -> None:
    _package(tmp_path, {
        "planted/__init__.py": "",
        "planted/low/__init__.py": "",
        "planted/low/a.py": "from planted.low import b\n",  # a <-> b: a module-level cycle
        "planted/low/b.py": "def f():\n    from planted.low import a\n",  # inside a function counts too
        "planted/low/c.py": "import planted.high.d\n",  # up the layers, and low <-> high: a package-level cycle
        "planted/high/__init__.py": "",
        "planted/high/d.py": "import planted.low.a\n",
        "planted/free.py": "",
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph("planted")
    assert cycles(graph, "planted") == [["planted.high", "planted.low"], ["planted.low.a", "planted.low.b"]]
    bad = layer_violations(graph, "planted", (("planted.low",), ("planted.high",)))
    assert bad == ["planted.free is in no layer", "planted.low.c (line 1) imports planted.high.d, of a later layer"]
    # the same package without the planted imports passes
    _package(tmp_path, {"planted/low/b.py": "", "planted/low/c.py": ""})
    graph = import_graph("planted")
    assert cycles(graph, "planted") == []
    assert layer_violations(graph, "planted", (("planted.low", "planted.free"), ("planted.high",))) == []


def test_the_private_import_check_finds_each_form(tmp_path, monkeypatch) -> None:
    _package(tmp_path, {
        "priv/__init__.py": "_shared = 1\n",
        "priv/a.py": "_hidden = 1\n",
        "priv/sub/__init__.py": "",
        "priv/sub/_inner.py": "x = 1\n",
        "priv/sub/ok.py": "from priv import _shared\nfrom priv.sub import _inner\nimport numpy as np\n"
                          "y = np._NoValue\n",  # a package's own, and another package's (not checked)
        "priv/b.py": "from priv.a import _hidden\nimport priv.a as a\nz = a._other\n"
                     "def f():\n    from priv.sub._inner import x\n    import priv\n    return priv.a._late\n",
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    assert private_imports("priv") == ["priv/b.py:1 imports priv.a._hidden", "priv/b.py:7 imports priv.a._late",
                                       "priv/b.py:3 imports priv.a._other", "priv/b.py:5 imports priv.sub._inner"]
    allowed = {"priv/b.py:priv.a._hidden": "why", "priv/b.py:priv.a._gone": "why"}
    assert private_imports("priv", allowed)[-1] == "priv/b.py:priv.a._gone: listed, but imported no more (remove it)"
    assert len(private_imports("priv", allowed)) == 4


def test_the_size_check_finds_a_long_function_and_file(tmp_path, monkeypatch) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(79))  # 80 lines with the def: at the limit
    _package(tmp_path, {
        "sized/__init__.py": "",
        "sized/a.py": f"def ok():\n{body}\n\n\nclass C:\n    @staticmethod\n    def long():\n    "
                      + body.replace("\n", "\n    ") + "\n        y = 1\n",  # 81 lines
        "sized/b.py": "x = 1\n" * 801,
        "sized/c.py": "x = 1\n" * 800,
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    assert long_code("sized", {}) == ["sized/a.py:C.long 81 lines", "sized/b.py 801 lines"]
    allowed = {"sized/b.py": "why", "sized/c.py": "why", "sized/a.py:ok": "why", "other/x.py": "another package's"}
    assert long_code("sized", allowed) == ["sized/a.py:C.long 81 lines",
                                           "sized/a.py:ok: listed, but not over the limit (remove it)",
                                           "sized/c.py: listed, but not over the limit (remove it)"]
