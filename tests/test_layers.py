"""Import contracts (issue 38): alphamodel has no import cycle, its layers import downward only,
it imports no other module's private names and has no function over 80 lines, alphafeat never
imports alphamodel; and the checkers find a cycle, an upward import and a private import planted
in packages made for the test."""

from __future__ import annotations

from layers import ALPHAMODEL_LAYERS, cycles, import_graph, layer_violations, long_code, private_imports


def test_alphamodel_has_no_import_cycle():
    assert cycles(import_graph("alphamodel"), "alphamodel") == []


def test_alphamodel_layers_import_downward_only():
    assert layer_violations(import_graph("alphamodel"), "alphamodel", ALPHAMODEL_LAYERS) == []


def test_alphafeat_never_imports_alphamodel():
    graph = import_graph("alphafeat", "alphamodel")
    assert not graph.chain_exists(importer="alphafeat", imported="alphamodel", as_packages=True), \
        graph.find_shortest_chains(importer="alphafeat", imported="alphamodel")


def _package(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_checker_finds_a_planted_cycle_and_an_upward_import(tmp_path, monkeypatch):
    _package(tmp_path, {
        "planted/__init__.py": "",
        "planted/low/__init__.py": "",
        "planted/low/a.py": "from planted.low import b\n",  # a <-> b: a module-level cycle
        "planted/low/b.py": "def f():\n    from planted.low import a\n",  # inside a function counts too
        "planted/low/c.py": "import planted.high.d\n",  # up the layers, and low <-> high: a package-level cycle
        "planted/high/__init__.py": "",
        "planted/high/d.py": "import planted.low.a\n",
        "planted/free.py": "",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph("planted")
    found = cycles(graph, "planted")
    assert ["planted.low.a", "planted.low.b"] in found
    assert ["planted.high", "planted.low"] in found
    bad = layer_violations(graph, "planted", (("planted.low",), ("planted.high",)))
    assert bad == ["planted.free is in no layer", "planted.low.c (line 1) imports planted.high.d, of a later layer"]
    # the same package without the planted imports passes
    _package(tmp_path, {"planted/low/b.py": "", "planted/low/c.py": ""})
    graph = import_graph("planted")
    assert cycles(graph, "planted") == []
    assert layer_violations(graph, "planted", (("planted.low", "planted.free"), ("planted.high",))) == []


def test_alphamodel_imports_no_private_name_of_another_module():
    assert private_imports("alphamodel") == []


def test_the_private_import_check_finds_one(tmp_path, monkeypatch):
    _package(tmp_path, {"priv/__init__.py": "", "priv/a.py": "_hidden = 1\n",
                        "priv/b.py": "from priv.a import _hidden\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [s.split("priv/", 1)[1] for s in private_imports("priv")] == ["b.py:1 imports priv.a._hidden"]


def test_alphamodel_has_no_function_over_80_lines_and_no_file_over_800():
    assert long_code("alphamodel") == []
