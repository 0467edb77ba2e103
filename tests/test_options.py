"""alphafeat.options: a dataclass's fields declare each option once; the parser, the config built
from it, the checks of a config built in Python and the markdown reference all come from them."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path

import pytest

from alphafeat.commandline import Parser
from alphafeat.errors import UsageError
from alphafeat.options import add_options, check_fields, from_args, given, opt, optional, render_cli_md
from alphafeat.validation import Device, validate_bool, validate_horizons, validate_int, validate_jobs, validate_path

_SIZE = functools.partial(validate_int, lo=1, what="a size")


@dataclasses.dataclass
class Toy:
    inputs: list[Path] = opt(help="input files", check=validate_path, nargs="+", flag="--input", metavar="PATH",
                             cli_default=None, default_text="the sample | the embedded one")  # fmt: skip
    out: Path = opt(Path("out"), help="output directory", check=validate_path)
    jobs: int = opt(1, help="worker processes", check=validate_jobs)
    device: str = opt("auto", help="where it runs", enum=Device)
    horizons: tuple[int, ...] = opt((30, 100), help="label horizons, comma-separated", check=validate_horizons)
    size: int = opt(8, help="a size in 100% of cases", check=_SIZE)
    threads: int | None = opt(None, help="threads", check=optional(_SIZE), default_text="one per core")
    prune: bool = opt(False, help="delete old partitions", check=validate_bool)
    kelly: bool = opt(True, help="unit position size", negate=True)
    barrier_horizon: int = opt(1000, help="vertical barrier", check=_SIZE, cli=False)


def _parser(**kw) -> argparse.ArgumentParser:
    p = Parser(prog="toy", description="a toy command")
    add_options(p, Toy, **kw)
    return p


def test_parser_args_and_the_same_object() -> None:
    p = _parser()
    args = p.parse_args(["--input", "a", "b", "--input", "c", "--jobs", "2", "--device", "cpu", "--horizons", "5,10",
                         "--size", "3", "--threads", "4", "--prune", "--no-kelly", "--out", "~/x"])  # fmt: skip
    got = from_args(Toy, args)
    assert got == Toy(inputs=[Path("a"), Path("b"), Path("c")], out=Path("~/x").expanduser(), jobs=2, device="cpu",
                      horizons=(5, 10), size=3, threads=4, prune=True, kelly=False)  # fmt: skip
    assert got.device is Device.CPU and got.horizons == (5, 10) and isinstance(got.out, Path)
    assert from_args(Toy, p.parse_args([]), inputs=[Path("a")]) == Toy(inputs=[Path("a")])
    assert not hasattr(args, "barrier_horizon")  # cli=False: not an option of the command line


def test_defaults_false_gives_only_what_was_given() -> None:
    p = _parser(defaults=False)
    assert given(Toy, p.parse_args([])) == {}
    assert given(Toy, p.parse_args(["--jobs", "3", "--no-kelly"])) == {"jobs": 3, "kelly": False}
    assert "(default: 1)" in p.format_help()  # the field's default is still what --help names


def test_only_and_skip_choose_options_and_a_misspelt_name_is_refused() -> None:
    p = Parser(prog="toy")
    assert add_options(p, Toy, only=["size", "jobs"]) == ["size", "jobs"]
    assert add_options(Parser(prog="toy"), Toy, skip=["inputs", "out"])[:2] == ["jobs", "device"]
    with pytest.raises(UsageError, match="sise"):
        add_options(Parser(prog="toy"), Toy, only=["sise"])


BAD = [("--jobs", "0"), ("--device", "tpu"), ("--horizons", "0"), ("--horizons", "5,5"), ("--size", "0"),
       ("--size", "x"), ("--threads", "0"), ("--out", " ")]  # fmt: skip


@pytest.mark.parametrize(("flag", "value"), BAD)
def test_a_bad_value_is_one_line_naming_the_option_exit_2(flag, value, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        _parser().parse_args([flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"toy: error: argument {flag}: expected ") and err.rstrip().endswith("(see toy --help)")


@pytest.mark.parametrize(("flag", "value"), BAD)
def test_check_fields_refuses_what_the_parser_refuses(flag, value, capsys) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args([flag, value])
    problem = capsys.readouterr().err.split(f"argument {flag}: ")[1].removesuffix(" (see toy --help)\n")
    name = flag.removeprefix("--").replace("-", "_")
    built = Toy(inputs=[Path("a")], **{name: value})
    with pytest.raises(UsageError) as e:
        check_fields(built)
    assert (e.value.option, e.value.problem) == (flag, problem)
    with pytest.raises(UsageError) as e:
        check_fields(built, key="toy.")
    assert e.value.option == f"toy.{name}"


def test_check_fields_normalises_and_checks_python_only_fields() -> None:
    got = check_fields(Toy(inputs=("a",), jobs="2", device="cuda", horizons="5,10", threads=None))
    assert got.inputs == [Path("a")] and got.jobs == 2 and got.device is Device.CUDA and got.horizons == (5, 10)
    for kw, name in (({"barrier_horizon": 0}, "barrier_horizon"), ({"inputs": "a"}, "--input"),
                     ({"prune": "yes"}, "--prune")):
        with pytest.raises(UsageError) as e:
            check_fields(Toy(**{"inputs": [Path("a")], **kw}))
        assert e.value.option == name


def test_help_names_each_default_once_and_never_by_hand() -> None:
    text = " ".join(_parser().format_help().split())
    for words in ("output directory (default: out)", "worker processes (default: 1)", "(default: auto)",
                  "label horizons, comma-separated (default: 30,100)", "a size in 100% of cases (default: 8)",
                  "threads (default: one per core)", "input files (default: the sample | the embedded one)"):
        assert text.count(words) == 1, words
    assert text.count("(default:") == 7  # the flags (--prune, --no-kelly) have none
    for f in dataclasses.fields(Toy):
        assert "default" not in f.metadata["alphafeat.option"].help  # written once, by help_text


def test_render_cli_md_sections_options_and_no_terminal_width(monkeypatch) -> None:
    top = Parser(prog="toys", description="toy programs")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    add_options(sub.add_parser("one", description="the first toy"), Toy)
    monkeypatch.setenv("COLUMNS", "40")
    narrow = render_cli_md([top])
    monkeypatch.setenv("COLUMNS", "300")
    assert render_cli_md([top]) == narrow
    assert "## `toys`" in narrow and "### `toys one`" in narrow and "the first toy" in narrow
    assert "usage: toys one [-h] [--input PATH [PATH ...]]" in narrow
    assert "| `--jobs JOBS` | worker processes (default: 1) |" in narrow
    assert "| `--input PATH ...` | input files (default: the sample \\| the embedded one) |" in narrow
    assert "a size in 100% of cases (default: 8)" in narrow and "| `--no-kelly` | unit position size |" in narrow


def test_deferred_options_are_added_when_the_parser_is_first_used(capsys) -> None:
    """A command's options declared by a config whose module is costly to import are added when
    that command is used (parsed, --help), not when the program's parser is built."""
    calls = []
    top = Parser(prog="toys")
    sub = top.add_subparsers(dest="command")
    sub.add_parser("one", options=lambda p: calls.append(add_options(p, Toy, only=["jobs"])))
    sub.add_parser("two")
    assert top.parse_args(["two"]).command == "two" and calls == []
    assert top.parse_args(["one", "--jobs", "3"]).jobs == 3 and calls == [["jobs"]]
    assert "--jobs" in sub.choices["one"].format_help() and len(calls) == 1  # added once


def test_the_programs_help_imports_no_numba() -> None:
    """``alphafeat --help`` and its light commands do not import precompute's config (numba,
    ~0.6 s): its options are added when precompute or roll-schedule is used."""
    import subprocess
    import sys

    code = ("import sys; from alphafeat.cli import build_parser; p = build_parser(); p.format_help(); "
            "p.parse_args(['features']); print('numba' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert out.stdout.split() == ["False"]


def test_docs_cli_md_is_what_the_parsers_say() -> None:
    """docs/cli.md is generated from both command lines' parsers and alphamodel's configs; a
    changed option, key or help fails here until it is regenerated."""
    from alphafeat.options import reference

    path = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
    want = reference()
    if not path.is_file() or path.read_text() != want:
        pytest.fail("docs/cli.md differs from what the parsers say: regenerate it with "
                    "`python -m alphafeat.options --write docs/cli.md`", pytrace=False)  # fmt: skip


def test_alphamodels_parser_imports_no_torch() -> None:
    """alphamodel's train and backtest options come from configs whose modules import no torch:
    ``alphamodel --help`` and a usage error stay fast, and say so without PyTorch installed."""
    import subprocess
    import sys

    code = ("import sys; from alphamodel.cli import build_parser; p = build_parser(); "
            "[p.parse_args([c]) for c in ('train', 'backtest')]; print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert out.stdout.split() == ["False"]


def test_config_file_keys_are_rendered_with_json_defaults() -> None:
    """The reference's config-file section lists every declared key, on the command line or not,
    its default as a JSON file writes it."""
    text = render_cli_md([], [("toy file", Toy, "a note")])
    assert "## Config-file keys" in text and "### toy file" in text and "a note" in text
    for row in ("| `inputs` | the sample \\| the embedded one | input files |", "| `prune` | false |",
                "| `horizons` | [30, 100] |", "| `threads` | one per core |", "| `barrier_horizon` | 1000 |"):
        assert row in text, row
