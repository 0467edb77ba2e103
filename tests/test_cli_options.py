"""Every option of every command with bad values: one line on stderr naming the option and the
value, exit status 2 for a usage error (1 for a bad file or cache), no traceback, nothing
written. A table, checked against the parsers so that a new option without a row fails."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alphafeat.cli import build_parser as alphafeat_parser
from alphafeat.cli import main as alphafeat_main
from alphamodel.cli import build_parser as alphamodel_parser
from alphamodel.cli import main as alphamodel_main

PROJECT = Path(__file__).resolve().parents[1]
DATA = str(PROJECT / "data")
USAGE, DATA_ERROR = 2, 1

# {tmp}: the test's folder; {file}: a file in it; {cfg:NAME}: a config file written by CONFIGS
PRECOMPUTE = ("alphafeat", ["precompute", "-q", "--input", DATA, "--out", "{tmp}/cache"])
ROLL = ("alphafeat", ["roll-schedule", "--input", DATA])
SYNTH = ("alphafeat", ["synth", "--start", "2024-01-02", "--out", "{tmp}/synth"])
FEATURES = ("alphafeat", ["features"])
INSPECT = ("alphafeat", ["inspect", "{tmp}/nocache"])
CLEAN = ("alphafeat", ["clean", "{tmp}/nocache"])
TRAIN = ("alphamodel", ["train", "-q", "--cache", "{tmp}/nocache", "--out", "{tmp}/out"])
BACKTEST = ("alphamodel", ["backtest", "-q", "--cache", "{tmp}/nocache", "--out", "{tmp}/out"])
EMBED = ("alphamodel", ["embed", "{tmp}/nocache", "--model", "{tmp}/nomodel"])

CONFIGS = {
    "epochs0": {"train": {"epochs": 0}},
    "epochs_str": {"train": {"epochs": "ten"}},
    "batch0": {"train": {"batch_size": 0}},
    "burn_in": {"train": {"window": 8, "burn_in": 16}},
    "weighting": {"train": {"horizon_weighting": "sqrt"}},
    "lr": {"train": {"lr": -1}},
    "compile": {"train": {"compile": "yes"}},
    "folds0": {"train": {"folds": 0}},
    "context": {"train": {"context": "long"}},
    "embargo": {"train": {"embargo": 1.0}},
    "n_boot": {"train": {"n_boot": 1}},
    "baselines": {"train": {"baselines": ["logistic", "xgboost"]}},
    "eval_piece": {"train": {"eval_piece": 0}},
    "loader_threads": {"train": {"loader_threads": 0}},
    "cfc_impl": {"model": {"cfc_impl": "scan"}},
    "old_key": {"train": {"val_frac": 0.2}},
    "unknown": {"train": {"no_such_key": 1}},
    "d_model": {"model": {"d_model": "big"}},
    "headdim": {"model": {"d_model": 32, "expand": 2, "headdim": 24}},
    "dropout": {"model": {"dropout": 1.5}},
    "top": {"optimiser": {}},
    "list": [1, 2],
    # alphamodel backtest --config: BacktestConfig keys, "c51" an object of C51Config keys
    "bt_stride": {"stride": 0},
    "bt_costs": {"costs": [0, 20]},
    "bt_folds": {"folds": 1},
    "bt_fee_max": {"fee_max": -1},
    "bt_device": {"device": "tpu"},
    "bt_kelly": {"kelly": "no"},
    "bt_unknown": {"no_such_key": 1},
    "bt_atoms": {"c51": {"n_atoms": 1}},
    "bt_support": {"c51": {"v_min": 5, "v_max": 1}},
    "bt_c51": {"c51": 3},
    "bt_c51_key": {"c51": {"atoms": 51}},
}

# (command, option, extra argv, exit status, words the one error line holds)
CASES = [
    (PRECOMPUTE, "--instrument-mode", ["--instrument-mode", "id=x"], USAGE, ["id=x"]),
    (PRECOMPUTE, "--instrument-mode", ["--instrument-mode", "id=-1"], USAGE, ["id=-1"]),
    (PRECOMPUTE, "--instrument-mode", ["--instrument-mode", "spread"], USAGE, ["spread", "front-month"]),
    (PRECOMPUTE, "--input", ["--input", "{tmp}/nope.dbn"], DATA_ERROR, ["nope.dbn", "no such file"]),
    (PRECOMPUTE, "--input", ["--input", ""], USAGE, ["--input"]),
    (PRECOMPUTE, "--out", ["--out", "{file}"], DATA_ERROR, ["notes.txt", "is a file"]),
    (PRECOMPUTE, "--out", ["--out", ""], USAGE, ["--out"]),
    (PRECOMPUTE, "--device", ["--device", "gpu"], USAGE, ["gpu", "auto, cpu or cuda"]),
    (PRECOMPUTE, "--root", ["--root", "E-S"], USAGE, ["E-S"]),
    (PRECOMPUTE, "--horizons", ["--horizons", "0"], USAGE, ["'0'", ">= 1"]),
    (PRECOMPUTE, "--horizons", ["--horizons=-5"], USAGE, ["'-5'"]),
    (PRECOMPUTE, "--horizons", ["--horizons", "abc"], USAGE, ["abc"]),
    (PRECOMPUTE, "--horizons", ["--horizons", "1.5"], USAGE, ["1.5"]),
    (PRECOMPUTE, "--horizons", ["--horizons", "30,30"], USAGE, ["30,30", "distinct"]),
    (PRECOMPUTE, "--horizons", ["--horizons", ""], USAGE, ["''"]),
    (PRECOMPUTE, "--sample", ["--sample", "volume:0"], USAGE, ["volume:0"]),
    (PRECOMPUTE, "--sample", ["--sample", "bars"], USAGE, ["bars"]),
    (PRECOMPUTE, "--features", ["--features", "bogus"], USAGE, ["bogus"]),
    (PRECOMPUTE, "--features", ["--features", "default,"], USAGE, ["empty name", "'default,'"]),
    (PRECOMPUTE, "--dtype", ["--dtype", "float16"], USAGE, ["float16"]),
    (PRECOMPUTE, "--compression", ["--compression", "gzip"], USAGE, ["gzip"]),
    (PRECOMPUTE, "--scheduler", ["--scheduler", "a host"], USAGE, ["a host"]),
    (PRECOMPUTE, "--scheduler", ["--scheduler", "tcp://h:8786", "--dask-local", "2"], USAGE, ["--dask-local"]),
    (PRECOMPUTE, "--dask-local", ["--dask-local", "-1"], USAGE, ["'-1'"]),
    (PRECOMPUTE, "--predecoded", ["--predecoded", "maybe"], USAGE, ["maybe"]),
    (PRECOMPUTE, "--predecoded-dir", ["--predecoded-dir", ""], USAGE, ["--predecoded-dir"]),
    (PRECOMPUTE, "--predecoded-dir", ["--predecoded-dir", "{file}"], DATA_ERROR, ["notes.txt", "is a file"]),
    (PRECOMPUTE, "--schema", ["--schema", "tbbo"], USAGE, ["tbbo", "mbo, mbp-10 or mbp-1"]),
    (PRECOMPUTE, "--schema", ["--schema", "mbo"], DATA_ERROR, ["--schema mbo: no mbo book file"]),
    (PRECOMPUTE, "--preopen", ["--preopen", "skip"], USAGE, ["skip", "keep or drop"]),
    (PRECOMPUTE, "--quiet", ["--quiet=yes"], USAGE, ["yes"]),
    (PRECOMPUTE, "--roll-rule", ["--roll-rule", "oi"], USAGE, ["oi"]),
    (PRECOMPUTE, "--roll-days", ["--roll-days", "-1"], USAGE, ["'-1'"]),
    (PRECOMPUTE, "--on-error", ["--on-error", "ignore"], USAGE, ["ignore"]),
    (PRECOMPUTE, "--rebuild-predecoded", ["--rebuild-predecoded=1"], USAGE, ["'1'"]),
    (PRECOMPUTE, "--prune", ["--prune=yes"], USAGE, ["'yes'"]),
    (PRECOMPUTE, "--jobs", ["--jobs", "0"], USAGE, ["'0'"]),
    (PRECOMPUTE, "--jobs", ["--jobs", "-2"], USAGE, ["'-2'"]),
    (PRECOMPUTE, "--jobs", ["--jobs", "many"], USAGE, ["many"]),
    (PRECOMPUTE, "--verbose", ["--verbose=2"], USAGE, ["'2'"]),
    (ROLL, "--input", ["--input", "{tmp}/nope.dbn"], DATA_ERROR, ["nope.dbn", "no such file"]),
    (ROLL, "--root", ["--root", ""], USAGE, ["''"]),
    (ROLL, "--out", ["--out", ""], USAGE, ["--out"]),
    (ROLL, "--roll-rule", ["--roll-rule", "oi"], USAGE, ["oi"]),
    (ROLL, "--roll-days", ["--roll-days", "x"], USAGE, ["'x'"]),
    (ROLL, "--on-error", ["--on-error", "warn"], USAGE, ["warn"]),
    (ROLL, "--rebuild-predecoded", ["--rebuild-predecoded=no"], USAGE, ["no"]),
    (ROLL, "--schema", ["--schema", "trades"], USAGE, ["trades"]),
    (ROLL, "--predecoded-dir", ["--predecoded-dir", ""], USAGE, ["--predecoded-dir"]),
    (ROLL, "--jobs", ["--jobs", "0"], USAGE, ["'0'"]),
    (ROLL, "--verbose", ["--verbose=2"], USAGE, ["'2'"]),
    (SYNTH, "--default", ["--default=yes"], USAGE, ["yes"]),
    (SYNTH, "--start", ["--start", "2024-13-01"], USAGE, ["2024-13-01", "YYYY-MM-DD"]),
    (("alphafeat", ["synth", "--out", "{tmp}/synth"]), "--start", [], USAGE, ["--start", "required"]),
    (SYNTH, "--sessions", ["--sessions", "0"], USAGE, ["'0'"]),
    (SYNTH, "--out", ["--out", ""], USAGE, ["--out"]),
    (SYNTH, "--schemas", ["--schemas", "mbp-10,tbbo"], USAGE, ["tbbo"]),
    (SYNTH, "--schemas", ["--schemas", "trades,trades"], USAGE, ["trades,trades"]),
    (SYNTH, "--seed", ["--seed", "-1"], USAGE, ["'-1'"]),
    (SYNTH, "--scale", ["--scale", "huge"], USAGE, ["huge"]),
    (SYNTH, "--jobs", ["--jobs", "0"], USAGE, ["'0'"]),
    (SYNTH, "--zstd-level", ["--zstd-level", "23"], USAGE, ["'23'"]),
    (SYNTH, "--signal", ["--signal", "-0.5"], USAGE, ["'-0.5'", ">= 0"]),
    (SYNTH, "--signal", ["--signal", "strong"], USAGE, ["strong"]),
    (SYNTH, "--signal", ["--signal", "nan"], USAGE, ["nan"]),
    (SYNTH, "--signal-kind", ["--signal-kind", "tape"], USAGE, ["tape", "book, history or both"]),
    (SYNTH, "--report", ["--report=1"], USAGE, ["'1'"]),
    (SYNTH, "--signal-file", ["--signal-file=1"], USAGE, ["'1'"]),
    (SYNTH, "--real", ["--report", "--real", "{tmp}/nope.dbn.zst"], DATA_ERROR, ["nope.dbn.zst", "missing"]),
    (SYNTH, "--verbose", ["--verbose=2"], USAGE, ["'2'"]),
    (FEATURES, "--json", ["--json=1"], USAGE, ["'1'"]),
    (FEATURES, "--verbose", ["--verbose=2"], USAGE, ["'2'"]),
    (INSPECT, "cache", [], DATA_ERROR, ["nocache", "no such folder"]),
    (("alphafeat", ["inspect", ""]), "cache", [], USAGE, ["cache"]),
    (INSPECT, "--plots", ["--plots", ""], USAGE, ["--plots"]),
    (INSPECT, "--no-plots", ["--no-plots=1"], USAGE, ["'1'"]),
    (INSPECT, "--verbose", ["--verbose=2"], USAGE, ["'2'"]),
    (CLEAN, "cache", [], DATA_ERROR, ["nocache", "no such folder"]),
    (("alphafeat", ["clean", "{tmp}"]), "cache", [], DATA_ERROR, ["not an alphafeat cache", "nothing removed"]),
    (CLEAN, "--keep-predecoded", ["--keep-predecoded=1"], USAGE, ["'1'"]),
    (CLEAN, "--verbose", ["--verbose=2"], USAGE, ["'2'"]),
    (("alphafeat", ["--verbose=2", "features"]), "--verbose", [], USAGE, ["'2'"]),
    (("alphafeat", ["precompile"]), "command", [], USAGE, ["precompile"]),
    (TRAIN, "--cache", [], DATA_ERROR, ["nocache", "no such cache directory"]),
    (TRAIN, "--out", ["--out", ""], USAGE, ["--out"]),
    (TRAIN, "--out", ["--out", "{file}"], DATA_ERROR, ["notes.txt", "is a file"]),
    (TRAIN, "--epochs", ["--epochs", "0"], USAGE, ["'0'", ">= 1"]),
    (TRAIN, "--epochs", ["--epochs", "-3"], USAGE, ["'-3'"]),
    (TRAIN, "--epochs", ["--epochs", "ten"], USAGE, ["ten"]),
    (TRAIN, "--window", ["--window", "0"], USAGE, ["'0'"]),
    (TRAIN, "--device", ["--device", "tpu"], USAGE, ["tpu"]),
    (TRAIN, "--seed", ["--seed", "-1"], USAGE, ["'-1'"]),
    (TRAIN, "--batch-size", ["--batch-size", "0"], USAGE, ["'0'"]),
    (TRAIN, "--steps-per-epoch", ["--steps-per-epoch", "0"], USAGE, ["'0'"]),
    (TRAIN, "--threads", ["--threads", "0"], USAGE, ["'0'"]),
    (TRAIN, "--folds", ["--folds", "0"], USAGE, ["'0'", ">= 1"]),
    (TRAIN, "--folds", ["--folds", "two"], USAGE, ["two"]),
    (TRAIN, "--context", ["--context", "long"], USAGE, ["long", "stateful or window"]),
    (TRAIN, "--compile", ["--compile=1"], USAGE, ["'1'"]),
    (TRAIN, "--quiet", ["--quiet=1"], USAGE, ["'1'"]),
    (TRAIN, "--verbose", ["--verbose=1"], USAGE, ["'1'"]),
    (TRAIN, "--config", ["--config", "{tmp}/nope.json"], DATA_ERROR, ["nope.json", "cannot read"]),
    (TRAIN, "--config", ["--config", "{file}"], DATA_ERROR, ["notes.txt", "cannot read"]),
] + [
    (TRAIN, "--config", ["--config", f"{{cfg:{name}}}"], DATA_ERROR, [f"{name}.json", *words])
    for name, words in {
        "epochs0": ["train.epochs", "0"], "epochs_str": ["train.epochs", "ten"], "batch0": ["train.batch_size"],
        "burn_in": ["train.burn_in", "window=8"], "weighting": ["train.horizon_weighting", "sqrt"],
        "lr": ["train.lr", "-1"], "compile": ["train.compile", "yes"], "folds0": ["train.folds", "got 0"],
        "context": ["train.context", "long", "stateful or window"], "embargo": ["train.embargo", "< 1"],
        "n_boot": ["train.n_boot", ">= 2"], "baselines": ["train.baselines", "xgboost"],
        "eval_piece": ["train.eval_piece", "got 0"], "loader_threads": ["train.loader_threads", "got 0"],
        "cfc_impl": ["model.cfc_impl", "scan"], "old_key": ["unknown key", "val_frac"],
        "unknown": ["no_such_key"], "d_model": ["model.d_model", "big"], "headdim": ["model.headdim", "24"],
        "dropout": ["model.dropout", "1.5"], "top": ["optimiser"], "list": ["JSON object"],
    }.items()
] + [
    (BACKTEST, "--cache", [], DATA_ERROR, ["nocache", "no such cache directory"]),
    (BACKTEST, "--cache", ["--cache", ""], USAGE, ["--cache"]),
    (BACKTEST, "--model", ["--model", "{tmp}/nomodel"], DATA_ERROR, ["nomodel", "missing"]),
    (BACKTEST, "--model", ["--model", ""], USAGE, ["--model"]),
    (BACKTEST, "--out", ["--out", ""], USAGE, ["--out"]),
    (BACKTEST, "--out", ["--out", "{file}"], DATA_ERROR, ["notes.txt", "is a file"]),
    (BACKTEST, "--folds", ["--folds", "1"], USAGE, ["'1'", ">= 2"]),
    (BACKTEST, "--folds", ["--folds", "two"], USAGE, ["two"]),
    (BACKTEST, "--embargo", ["--embargo", "-1"], USAGE, ["'-1'", ">= 0"]),
    (BACKTEST, "--costs", ["--costs", "0,-0.5"], USAGE, ["0,-0.5", "[0, 10]"]),
    (BACKTEST, "--costs", ["--costs", "0,50"], USAGE, ["0,50"]),
    (BACKTEST, "--costs", ["--costs", "0,x"], USAGE, ["0,x"]),
    (BACKTEST, "--costs", ["--costs", "0.25,0.25"], USAGE, ["0.25,0.25", "distinct"]),
    (BACKTEST, "--costs", ["--costs", ""], USAGE, ["''"]),
    (BACKTEST, "--stride", ["--stride", "0"], USAGE, ["'0'", ">= 1"]),
    (BACKTEST, "--stride", ["--stride", "1.5"], USAGE, ["1.5"]),
    (BACKTEST, "--envs", ["--envs", "0"], USAGE, ["'0'"]),
    (BACKTEST, "--policy-steps", ["--policy-steps", "-1"], USAGE, ["'-1'"]),
    (BACKTEST, "--fine-tune", ["--fine-tune=1"], USAGE, ["'1'"]),
    (BACKTEST, "--no-kelly", ["--no-kelly=1"], USAGE, ["'1'"]),
    (BACKTEST, "--device", ["--device", "gpu"], USAGE, ["gpu", "auto, cpu or cuda"]),
    (BACKTEST, "--seed", ["--seed", "-1"], USAGE, ["'-1'"]),
    (BACKTEST, "--fill", ["--fill", "maker"], USAGE, ["maker", "taker, mid, passive"]),
    (BACKTEST, "--fill", ["--fill", "mid,mid"], USAGE, ["mid,mid", "distinct"]),
    (BACKTEST, "--queue", ["--queue", "fifo"], USAGE, ["fifo", "riskaverse, power:N, log"]),
    (BACKTEST, "--queue", ["--queue", "power:0"], USAGE, ["power:0", "(0, 100]"]),
    (BACKTEST, "--latency-ns", ["--latency-ns", "-1"], USAGE, ["'-1'", ">= 0"]),
    (BACKTEST, "--timeout", ["--timeout", "0"], USAGE, ["'0'", ">= 1"]),
    (BACKTEST, "--on-timeout", ["--on-timeout", "wait"], USAGE, ["wait", "cancel"]),
    (BACKTEST, "--fee-maker", ["--fee-maker", "-1"], USAGE, ["'-1'", ">= 0"]),
    (BACKTEST, "--fee-taker", ["--fee-taker", "101"], USAGE, ["'101'", "<= 100"]),
    (BACKTEST, "--quiet", ["--quiet=1"], USAGE, ["'1'"]),
    (BACKTEST, "--verbose", ["--verbose=1"], USAGE, ["'1'"]),
    (BACKTEST, "--config", ["--config", "{tmp}/nope.json"], DATA_ERROR, ["nope.json", "cannot read"]),
    (BACKTEST, "--config", ["--config", "{file}"], DATA_ERROR, ["notes.txt", "cannot read"]),
    (BACKTEST, "--config", ["--config", ""], USAGE, ["--config"]),
] + [
    (BACKTEST, "--config", ["--config", f"{{cfg:{name}}}"], DATA_ERROR, [f"{name}.json", *words])
    for name, words in {
        "bt_stride": ["stride: ", "got 0"], "bt_costs": ["costs: ", "0,20"],
        "bt_folds": ["folds: ", ">= 2"], "bt_fee_max": ["fee_max: ", "-1"], "bt_device": ["device: ", "tpu"],
        "bt_kelly": ["kelly: ", "'no'"], "bt_unknown": ["no_such_key"], "bt_atoms": ["c51.n_atoms", "got 1"],
        "bt_support": ["c51.v_min", "v_max=1"], "bt_c51": ["c51: ", "got 3"], "bt_c51_key": ["c51: ", "atoms"],
        "list": ["JSON object"],
    }.items()
] + [
    (EMBED, "--model", [], DATA_ERROR, ["nomodel", "missing"]),
    (("alphamodel", ["embed", "", "--model", "{tmp}/nomodel"]), "cache", [], USAGE, ["cache"]),
    (("alphamodel", ["embed", "{tmp}/nocache"]), "--model", [], USAGE, ["--model", "required"]),
    (EMBED, "--model", ["--model", ""], USAGE, ["--model"]),
    (EMBED, "--out", ["--out", ""], USAGE, ["--out"]),
    (EMBED, "--out", ["--out", "{file}"], DATA_ERROR, ["notes.txt", "exists"]),
    (EMBED, "--device", ["--device", "tpu"], USAGE, ["tpu"]),
    (EMBED, "--verbose", ["--verbose=1"], USAGE, ["'1'"]),
]  # fmt: skip


def _fill(argv: list[str], tmp: Path) -> list[str]:
    out = []
    for a in argv:
        if a.startswith("{cfg:"):
            name = a[5:-1]
            p = tmp / f"{name}.json"
            p.write_text(json.dumps(CONFIGS[name]))
            a = str(p)
        out.append(a.replace("{tmp}", str(tmp)).replace("{file}", str(tmp / "notes.txt")))
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"/" for p in sorted(root.rglob("*"))}


def _id(case: tuple) -> str:
    (prog, base), opt, extra, status, _ = case
    return f"{prog} {base[0]} {opt} {' '.join(extra)}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_value_is_one_line(case, tmp_path, capsys):
    (prog, base), option, extra, status, words = case
    (tmp_path / "notes.txt").write_text("mine")
    argv = _fill(base + extra, tmp_path)
    before = _tree(tmp_path)
    in_project = [(PROJECT / d).exists() for d in (".predecoded", "cache")]  # a user's earlier run may hold them
    rc = (alphafeat_main if prog == "alphafeat" else alphamodel_main)(argv)
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert rc == status, captured.err
    assert len(lines) == 1 and "error:" in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out
    for w in words:
        assert w in lines[0], (w, lines[0])
    if status == USAGE and option.startswith("-") and option != "--scheduler":
        assert option in lines[0]  # the option is named
        if "required" not in lines[0]:  # worded as argparse words its own errors, whoever found it
            assert re.search(rf": error: argument (-\w/)?{option}: ", lines[0]), lines[0]
    assert _tree(tmp_path) == before  # nothing written, nothing changed
    assert [(PROJECT / d).exists() for d in (".predecoded", "cache")] == in_project  # none made here


def _options(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """{subcommand: its options' long names and positionals}, help left out."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        p.complete()  # the options it adds when first used
        out[name] = {max(a.option_strings, key=len) if a.option_strings else a.dest
                     for a in p._actions if not isinstance(a, argparse._HelpAction)}  # fmt: skip
    return out


def test_every_option_of_every_command_has_a_bad_value_row():
    covered: dict[tuple[str, str], set[str]] = {}
    for (prog, base), option, *_ in CASES:
        covered.setdefault((prog, base[0]), set()).add(option)
    for prog, parser in (("alphafeat", alphafeat_parser()), ("alphamodel", alphamodel_parser())):
        for command, options in _options(parser).items():
            missing = options - covered.get((prog, command), set())
            assert not missing, f"{prog} {command}: no bad-value row for {sorted(missing)}"


def test_verbose_adds_the_traceback(tmp_path, capsys):
    argv = ["precompute", "-q", "--input", str(tmp_path / "nope.dbn"), "--out", str(tmp_path / "c"), "-v"]
    assert alphafeat_main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("alphafeat precompute: error:")


def test_a_data_error_leaves_only_its_line(tmp_path, capsys):
    """The progress bar (on stderr) is cleared when the run fails: stderr is the error's one line."""
    bad = tmp_path / "bad.dbn"
    bad.write_bytes(b'{"a": 1}')
    rc = alphafeat_main(["precompute", "--input", str(bad), "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and err.startswith("alphafeat precompute: error: "), err
    assert "not a DBN file" in err, err
    assert not (tmp_path / "c").exists()


def test_a_warning_off_a_terminal_is_one_line_with_the_whole_path(tmp_path):
    """--on-error skip warns of the bad file; on a pipe or file that is one line naming the whole
    path (rich's log lines, for a terminal, wrap at 80 columns there and cut it). The results
    name it once, and the instrument table says which session has no partition."""
    deep = tmp_path / ("a-folder-name-long-enough-to-pass-eighty-columns-" * 2) / "in"
    deep.mkdir(parents=True)
    for p in sorted(Path(DATA).glob("*2024030[78]*.dbn.zst")):
        (deep / p.name).write_bytes(p.read_bytes())
    bad = deep / "glbx-mdp3-20240308.mbp-10.dbn.zst"
    bad.write_bytes(bad.read_bytes()[:300_000])
    argv = ["precompute", "--input", str(deep), "--out", str(tmp_path / "c"), "--on-error", "skip"]
    run = subprocess.run([sys.executable, "-m", "alphafeat.cli", *argv], cwd=PROJECT, capture_output=True, text=True)
    lines = [ln for ln in run.stderr.splitlines() if "WARNING" in ln]
    assert run.returncode == 0 and len(lines) == 1 and f"skipping {bad}: " in lines[0], run.stderr
    # the results name the file once, and the session it held has no partition
    assert sum(ln.startswith(f"skipped: {bad}: ") and ln.count(str(bad)) == 1 for ln in run.stdout.splitlines()) == 1
    assert [("no partition this run" in ln) for ln in run.stdout.splitlines() if "2024-03-0" in ln] == [False, True]


def test_synth_names_only_the_missing_option(tmp_path, capsys):
    assert alphafeat_main(["synth", "--out", str(tmp_path / "s")]) == USAGE
    err = capsys.readouterr().err
    assert "--start" in err and "--out" not in err and not (tmp_path / "s").exists(), err


def test_ctrl_c_while_the_parser_is_built_is_one_line(monkeypatch, capfd):
    """The console scripts (``alphafeat.cli:main``) build their parser, importing the modules
    whose options it declares, inside a guard: a Ctrl-C there gives the interrupted line and
    130, not a traceback."""
    import alphafeat.cli
    import alphamodel.cli
    from alphafeat import commandline

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(alphafeat.cli, "build_parser", interrupted)
    monkeypatch.setattr(alphamodel.cli, "build_parser", interrupted)
    assert alphafeat.cli.main([]) == 130 and alphamodel.cli.main([]) == 130
    out = capfd.readouterr()
    assert (out.out + out.err).strip().splitlines() == [commandline.INTERRUPTED] * 2


def test_a_finished_command_ignores_a_late_ctrl_c(tmp_path):
    """In its own process (no argv given), once the command has returned, SIGINT is ignored so
    that a late Ctrl-C cannot turn a finished run's exit into a traceback or status 130."""
    import subprocess
    import sys

    code = ("import atexit, signal, sys; from alphafeat.cli import main; sys.argv = ['alphafeat', 'precompute', "
            f"'--input', {str(tmp_path / 'missing')!r}]; "
            "atexit.register(lambda: print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)); main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout.split()[-1:] == ["True"]


def test_workers_start_with_ctrl_c_ignored():
    """joblib workers started inside ``spawning_workers`` ignore SIGINT for their life (a Ctrl-C
    reaches only the parent, which stops the pool: no worker tracebacks); the parent's handler
    is restored after."""
    import signal

    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor

    from alphafeat.plan import spawning_workers

    get_reusable_executor().shutdown(wait=True)  # no workers of earlier tests reused

    def disposition(_: int) -> object:
        import signal

        return signal.getsignal(signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with spawning_workers():
        gen = Parallel(n_jobs=2, return_as="generator")(delayed(disposition)(i) for i in range(4))
    assert signal.getsignal(signal.SIGINT) is before
    assert list(gen) == [signal.SIG_IGN] * 4
    get_reusable_executor().shutdown(wait=True)


def test_each_command_help_starts_with_its_line_in_the_list():
    """``PROG COMMAND --help`` opens with the line ``PROG --help`` lists for the command."""
    for parser in (alphafeat_parser(), alphamodel_parser()):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        listed = {a.dest: a.help.replace("%%", "%") for a in sub._choices_actions}  # as argparse prints it
        assert listed and set(listed) == set(sub.choices)
        for name, cmd in sub.choices.items():
            assert cmd.description == listed[name] and listed[name], name
            assert " ".join(listed[name].split()) in " ".join(cmd.format_help().split()), name


def test_an_unknown_option_is_named_by_its_command(capsys):
    """An option no command knows is reported by the command it was given to (its prog, its
    --help), as the command's other usage errors are: exit 2, one line."""
    for prog, main in (("alphafeat", alphafeat_main), ("alphamodel", alphamodel_main)):
        parser = alphafeat_parser() if prog == "alphafeat" else alphamodel_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name in sub.choices:
            assert main([name, "--no-such-option"]) == 2
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"{prog} {name}: error: "), (name, lines)
            assert lines[0].endswith(f"(see {prog} {name} --help)"), lines
            # a command with a required argument says that first (argparse's order)
            assert "unrecognized arguments: --no-such-option " in lines[0] or "are required" in lines[0], lines
