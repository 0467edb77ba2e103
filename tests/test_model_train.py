"""Masked loss, AUC, data windows and a tiny end-to-end training run on a hand-made cache."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
from hand_cache import write_hand_cache
from scipy.stats import mannwhitneyu, rankdata

from alphafeat.cache import MANIFEST
from alphafeat.errors import AlphafeatError, InputError, UsageError
from alphamodel.cli import main as cli_main
from alphamodel.data.cache import CacheData, Window
from alphamodel.nn.model import horizon_weights, masked_bce_loss
from alphamodel.supervised.checkpoint import load_model
from alphamodel.supervised.config import TrainConfig
from alphamodel.supervised.evaluation import walk_forward_folds
from alphamodel.supervised.metrics import auc, average_ranks, base_rate
from alphamodel.supervised.train import train

HORIZONS = [2, 5]


# ---- loss ----------------------------------------------------------------------------------
def test_masked_loss_ignores_nan_and_matches_hand_value():
    logits = torch.tensor([[0.0, 2.0], [1.0, -1.0], [-3.0, 0.5]])
    labels = torch.tensor([[1.0, math.nan], [0.0, 1.0], [math.nan, math.nan]])

    def bce(z, y):
        p = 1 / (1 + math.exp(-z))
        return -(y * math.log(p) + (1 - y) * math.log(1 - p))

    h0 = (bce(0.0, 1) + bce(1.0, 0)) / 2  # horizon 0: rows 0 and 1
    h1 = bce(-1.0, 1)  # horizon 1: row 1 only
    assert float(masked_bce_loss(logits, labels)) == pytest.approx((h0 + h1) / 2, rel=1e-6)
    w = torch.tensor([1.0, 0.25])
    assert float(masked_bce_loss(logits, labels, w)) == pytest.approx((h0 + 0.25 * h1) / 1.25, rel=1e-6)
    # a position mask removes row 1 entirely: horizon 1 has no label left and drops out
    mask = torch.tensor([True, False, True])
    assert float(masked_bce_loss(logits, labels, w, mask)) == pytest.approx(bce(0.0, 1), rel=1e-6)
    # gradients are finite and zero on NaN entries (torch.where, not NaN * 0)
    z = logits.clone().requires_grad_(True)
    masked_bce_loss(z, labels, w).backward()
    assert torch.isfinite(z.grad).all()
    assert float(z.grad[0, 1]) == 0.0 and float(z.grad[2].abs().sum()) == 0.0


def test_horizon_weights():
    assert horizon_weights([30, 100, 300], 100).tolist() == pytest.approx([1.0, 1.0, 1 / 3])
    assert horizon_weights([30, 100], 10, "equal").tolist() == [1.0, 1.0]


# ---- AUC -----------------------------------------------------------------------------------
def test_auc_matches_scipy_mannwhitney_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 500).astype(float)  # many ties
    labels = (rng.random(500) < 0.3 + 0.08 * scores).astype(float)
    labels[::17] = np.nan
    ok = ~np.isnan(labels)
    pos, neg = scores[ok][labels[ok] == 1], scores[ok][labels[ok] == 0]
    ref = mannwhitneyu(pos, neg, alternative="two-sided").statistic / (len(pos) * len(neg))
    assert auc(scores, labels) == pytest.approx(ref, abs=1e-12)
    assert np.allclose(average_ranks(scores), rankdata(scores, method="average"))
    assert math.isnan(auc(scores[:3], np.ones(3)))
    assert base_rate(np.array([1, 0, np.nan, 1])) == pytest.approx(2 / 3)


# ---- a hand-made cache with a planted signal ------------------------------------------------
def _write_cache(root, sessions=3, n=900, seed=0):
    """mid moves one tick per row; direction at t+1 is up with prob 0.5 + 0.4 * imbalance[t]."""
    rng = np.random.default_rng(seed)
    tables = []
    for s in range(sessions):
        imb = rng.uniform(-1, 1, n)
        step = np.where(rng.random(n) < 0.5 + 0.4 * imb, 1.0, -1.0)
        mid = 5000 + 0.25 * np.concatenate([[0.0], np.cumsum(step[:-1])])
        ts = (np.datetime64(f"2024-03-0{s + 4}T14:00:00", "ns").astype(np.int64)
              + np.cumsum(rng.integers(1_000_000, 50_000_000, n)))
        cols = {
            "ts_recv": pa.array(ts, pa.timestamp("ns", tz="UTC")),
            "mid": pa.array(mid),
            "microprice": pa.array(mid + 0.125 * imb),
            "imbalance_l1": pa.array(imb),
            "ofi_l01": pa.array(rng.normal(size=n)),
            "log_dt": pa.array(np.log(np.r_[1.0, np.diff(ts) / 1e9])),
        }
        for h in HORIZONS:
            y = np.full(n, np.nan, np.float32)
            d = mid[h:] - mid[:-h]
            y[: n - h] = np.where(d > 0, 1.0, np.where(d < 0, 0.0, np.nan))
            cols[f"label_h{h}"] = pa.array(y)
        tables.append(cols)
    columns = [{"name": "mid", "unit": "index points", "source": "standard"},
               {"name": "microprice", "unit": "index points", "source": "Stoikov"},
               {"name": "imbalance_l1", "unit": "", "source": ""},
               {"name": "ofi_l01", "unit": "contracts", "source": ""},
               {"name": "log_dt", "unit": "log seconds", "source": ""}]
    columns += [{"name": f"label_h{h}", "unit": "1 up / 0 down / NaN", "source": "alphafeat.labels"}
                for h in HORIZONS]
    return write_hand_cache(root, tables, columns, HORIZONS)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return _write_cache(tmp_path_factory.mktemp("c") / "cache")


def test_cache_data_spans_features_windows(cache):
    d = CacheData.open(cache)
    assert d.horizons == HORIZONS and d.n_rows == 2700
    assert d.feature_names == ["microprice-mid", "imbalance_l1", "ofi_l01", "log_dt"]
    t0, t1 = d.spans()
    seg = d.segments[1]
    n = seg.n
    k = 100
    assert t1[1][d.offsets[1] + k] == seg.ts[k + 5]  # t1 = ts[t + h]
    assert t1[1][d.offsets[2] - 1] == seg.ts[n - 1]  # clipped at the segment end (label NaN)
    x = d.raw_features(0, np.arange(5), d.feature_names)
    assert np.allclose(x[:, 0], d.segments[0].cols["imbalance_l1"][:5] * 0.5)  # (micro - mid) / tick
    rows = np.r_[10:400, 900:1500]  # crosses the segment break at 900
    wins = d.eval_windows(rows, window=64, burn_in=16)
    norm = d.fit_normaliser(rows)
    b = d.batch(wins, 64, norm)
    scored = np.sort(b.rows[b.mask])
    assert scored.tolist() == sorted(rows.tolist())  # every row scored exactly once
    for w in wins:  # no window crosses a segment
        assert 0 <= w.start < w.end <= d.segments[w.seg].n
    # normalisation uses only the given rows
    xr = np.concatenate([d.raw_features(0, np.arange(10, 400), norm.names),
                         d.raw_features(1, np.arange(0, 600), norm.names)])
    assert np.allclose(norm.mean, xr.mean(0)) and np.allclose(norm.std, xr.std(0))


@pytest.fixture(scope="module")
def one_session(tmp_path_factory):
    """One session: the walk-forward blocks are blocks of its rows, so labels reach across them."""
    return CacheData.open(_write_cache(tmp_path_factory.mktemp("c1") / "cache", sessions=1))


def _one_fold(d: CacheData):
    """The first walk-forward fold of ``d`` as training makes it (one session: its rows in thirds)."""
    t0, t1s = d.spans()
    return walk_forward_folds(t0, t1s, np.zeros(t0.size, np.int64), 1)[0]


def test_walk_forward_blocks_hide_labels_reaching_into_later_blocks(one_session):
    d = one_session
    f = _one_fold(d)
    tr, va, te, keep = f.train, f.val, f.test, f.keep
    t0, t1 = d.spans()
    assert tr.max() < va.min() and va.max() < te.min()
    for j in range(len(HORIZONS)):
        assert np.all(t1[j][tr[keep[tr, j]]] <= t0[va[0]])
        assert np.all(t1[j][va[keep[va, j]]] <= t0[te[0]])
        assert keep[te, j].all()
        # exactly the last h - 1 training rows (the label of row T0 - h ends at T0: touching is kept)
        assert (~keep[tr, j]).sum() == HORIZONS[j] - 1


def test_tiny_training_run_end_to_end_and_repeatable(cache, tmp_path):
    tc = TrainConfig(window=32, burn_in=8, batch_size=16, epochs=3, steps_per_epoch=15, lr=1e-2,
                     warmup_steps=5, device="cpu", seed=3)
    from alphamodel.nn.model import ModelConfig

    mc = ModelConfig(d_model=16, n_layers=1, d_state=8, headdim=8, chunk_size=16, cfc_hidden=8)
    s1 = train(cache, tmp_path / "a", mc, tc, progress=False)
    s2 = train(cache, tmp_path / "a", mc, tc, progress=False)  # a rerun into the same folder says what it replaced
    assert [h["train_loss"] for h in s1["history"]] == [h["train_loss"] for h in s2["history"]]
    assert s1["replaced"] == []
    assert s2["replaced"] == ["auc.png", "config.json", "loss.png", "model.safetensors", "summary.json"]
    assert not list((tmp_path / "a").glob(".*"))  # written aside (.partial-PID), then moved in: nothing left over
    assert (tmp_path / "a" / "model.safetensors").stat().st_mode & 0o777 == 0o644  # safetensors makes 0600
    for name in ("summary.json", "loss.png", "auc.png", "model.safetensors", "config.json"):
        assert (tmp_path / "a" / name).is_file()
    h2 = s1["horizons"][0]
    # the planted signal (next move vs imbalance) is learnt: well above chance, like the baseline
    assert h2["auc_model"] > 0.6 and h2["auc_logistic"] > 0.6
    assert 0.3 < h2["base_rate_test"] < 0.7
    model, norm, meta = load_model(tmp_path / "a")
    assert meta["features"] == norm.names and meta["horizons"] == HORIZONS
    # a config that does not fit the weights, or lacks a key: one message naming what is wrong
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "a", bad)
    conf = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**conf, "model": {**conf["model"], "d_state": 32}}))
    with pytest.raises(InputError, match=r"model.safetensors: weights do not match .*\(size mismatch for blocks\."):
        load_model(bad)
    (bad / "config.json").write_text(json.dumps({k: v for k, v in conf.items() if k != "normaliser"}))
    with pytest.raises(InputError, match=r"config.json: not an alphamodel config \(no key 'normaliser'\)"):
        load_model(bad)
    saved = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert saved["horizons"][0]["auc_model"] == pytest.approx(h2["auc_model"])


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["train", "--cache", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "no such cache directory" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "afile").write_text("x")
    assert cli_main(["train", "--cache", str(tmp_path / "afile"), "--out", str(tmp_path / "o")]) == 1
    assert "is a file, not a cache directory" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    assert cli_main(["train", "--cache", str(tmp_path / "bad"), "--out", str(tmp_path / "o")]) == 1
    assert "not an alphafeat cache" in capsys.readouterr().err
    cfg = tmp_path / "c.json"
    cfg.write_text('{"train": {"no_such_key": 1}}')
    assert cli_main(["train", "--cache", str(tmp_path / "bad"), "--config", str(cfg)]) == 1
    assert "no_such_key" in capsys.readouterr().err


def test_missing_label_column_is_a_clear_error(tmp_path):
    root = _write_cache(tmp_path / "c", sessions=1, n=50)
    m = json.loads((root / MANIFEST).read_text())
    m["params"]["horizons"] = [2, 7]
    (root / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(AlphafeatError, match="missing column.*label_h7"):
        CacheData.open(root)


def test_fracdiff_level_is_removed_from_the_inputs(tmp_path):
    """A fixed-window fracdiff of log(mid) carries c * log(mid) (c = sum of its weights): it
    enters as ``fracdiff_log_mid-level`` = fracdiff - c log(mid), which is 0 on a flat mid."""
    from alphamodel.data.cache import fracdiff_weight_sum

    d, W = 0.4, 6
    w = [1.0]
    for k in range(1, W):
        w.append(-w[-1] * (d - k + 1) / k)
    assert fracdiff_weight_sum(d, W) == pytest.approx(sum(w))
    root = _write_cache(tmp_path / "c", sessions=1, n=60)
    rel = json.loads((root / MANIFEST).read_text())["partitions"][0]
    t = pa.ipc.open_file(pa.BufferReader((root / rel).read_bytes())).read_all()  # not mapped: rewritten below
    lm = np.log(t.column("mid").to_numpy())
    fd = np.full(lm.size, np.nan)
    for i in range(W - 1, lm.size):
        fd[i] = sum(w[k] * lm[i - k] for k in range(W))
    t = t.append_column("fracdiff_log_mid", pa.array(fd))
    with pa.OSFile(str(root / rel), "wb") as f, pa.ipc.new_file(f, t.schema) as wr:
        wr.write_table(t)
    m = json.loads((root / MANIFEST).read_text())
    m["columns"].append({"name": "fracdiff_log_mid", "unit": "log points", "source": "AFML ch. 5",
                         "parameters": {"fracdiff_d": d, "window": W}})
    (root / MANIFEST).write_text(json.dumps(m))
    data = CacheData.open(root)
    assert "fracdiff_log_mid" not in data.feature_names and "fracdiff_log_mid-level" in data.feature_names
    x = data.raw_features(0, np.arange(60), ["fracdiff_log_mid-level"])[:, 0]
    ref = np.array([sum(w[k] * (lm[i - k] - lm[i]) for k in range(W)) if i >= W - 1 else np.nan
                    for i in range(60)])
    assert np.allclose(x, ref, equal_nan=True, atol=1e-12)  # a sum of past log returns, no level
    assert np.nanmax(np.abs(x)) < 1e-3 < abs(sum(w) * lm[0])
    _batch_inputs_equal_the_reference(data)


def _batch_inputs_equal_the_reference(data: CacheData) -> None:
    """The batch loader's fused gather (``CacheData._inputs_into``, numba) writes the same bits
    as the reference ``norm(raw_features(...))``, for left and right padding, NaN rows, a
    ``-mid`` and a ``-level`` input; padding stays 0."""
    from alphamodel.data.cache import Window

    names = data.feature_names
    assert any(n.endswith("-mid") for n in names) and any(n.endswith("-level") for n in names)
    norm = data.fit_normaliser(np.arange(data.n_rows), names)
    norm.std[0] = 1e-30  # huge z-scores: the clip is exercised
    n0, n1 = data.segments[0].n, data.segments[-1].n
    assert n0 >= 43 and n1 >= 25
    last = len(data.segments) - 1
    wins = [Window(0, 0, 40), Window(0, 3, 43), Window(last, 10, 25), Window(0, n0 - 40, n0), Window(last, 0, 1)]
    for pad in ("left", "right"):
        b = data.batch(wins, 40, norm, pad=pad)
        for i, w in enumerate(wins):
            n = w.end - w.start
            ref = norm(data.raw_features(w.seg, np.arange(w.start, w.end), names))
            pos = slice(40 - n, 40) if pad == "left" else slice(0, n)
            assert np.array_equal(b.x[i, pos], ref)  # bit for bit, NaN inputs already 0
            rest = np.ones(40, bool)
            rest[pos] = False
            assert not b.x[i, rest].any()
    assert np.abs(b.x[:, :, 0]).max() == norm.clip


def test_heads_keep_the_per_row_linear_path_under_dropout():
    """With every sequence feature dropped, the logits are the linear model of the row's inputs."""
    from alphamodel.nn.model import AlphaModel, ModelConfig

    torch.manual_seed(0)
    m = AlphaModel(ModelConfig(n_features=5, n_horizons=3, d_model=8, n_layers=1, d_state=4, headdim=4,
                               chunk_size=8, cfc_hidden=4, dropout=1.0)).train()
    x, dt = torch.randn(2, 7, 5), torch.rand(2, 7)
    W, b = m.heads.weight[:, -5:], m.heads.bias
    assert torch.allclose(m(x, dt), x @ W.T + b, atol=1e-6)


def test_cli_without_torch_says_what_to_install(tmp_path, capsys, monkeypatch):
    # a CPU user who installed only alphafeat: one line naming the extra, no ImportError traceback
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch -> ImportError
    assert cli_main(["train", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "pip install -e '.[model]'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# ---- summary words, optimiser groups, config checks ------------------------------------------
def test_labels_kept_after_purge_counts_labels_not_rows(one_session):
    from alphamodel.supervised.train import label_counts

    d = one_session
    keep = _one_fold(d).keep
    c = label_counts(d, keep)
    for j, h in enumerate(HORIZONS):
        y = np.concatenate([s.labels[j] for s in d.segments])  # the cache's labels, read directly
        has = ~np.isnan(y)
        kept, purged = c["labels_kept_after_purge"][f"h{h}"], c["labels_purged"][f"h{h}"]
        assert kept == int((has & keep[:, j]).sum()) and kept + purged == int(has.sum())
        assert kept < int(keep[:, j].sum())  # rows whose label is NaN (ties, session ends) are no labels
    assert c["labels_purged"]["h5"] == 2 * (5 - 1)  # the last h - 1 training and validation rows; odd h: no tie
    d.set_label_mask(keep)  # training sets the mask; the counts read the cache's labels as stored
    assert label_counts(d, keep) == c


def test_weight_decay_is_chosen_by_module_type():
    from torch import nn

    from alphamodel.nn.model import AlphaModel, ModelConfig
    from alphamodel.nn.optim import decayed_parameters, param_groups

    m = AlphaModel(ModelConfig(n_features=3, n_horizons=2, d_model=8, n_layers=1, d_state=4, headdim=4,
                               chunk_size=8, cfc_hidden=4))
    assert decayed_parameters(m) == [
        "embed.weight", "blocks.0.mixer.in_proj.weight", "blocks.0.mixer.conv1d.weight",
        "blocks.0.mixer.out_proj.weight", "cfc.cell.backbone.weight", "cfc.cell.fgh.weight", "heads.weight",
    ]  # fmt: skip
    # not decayed: biases, RMSNorm gains, A_log, D, dt_bias, log_tau
    groups = param_groups(m, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in m.parameters())  # each parameter in exactly one group
    # a 2-D parameter of another module type does not decay (type decides, not shape or name);
    # Mamba's _no_weight_decay flag takes a weight out
    m.extra = nn.Module()
    m.extra.weight = nn.Parameter(torch.zeros(3, 3))
    m.heads.weight._no_weight_decay = True
    names = decayed_parameters(m)
    assert "extra.weight" not in names and "heads.weight" not in names and "embed.weight" in names


def test_every_config_key_is_declared_once_with_its_rule():
    """Each key of each config is declared on its field (alphafeat.options.opt) with its check and
    help (a key added without them fails here, not silently checked by its type alone); a config
    file's number given as text is refused by that rule."""
    import dataclasses

    from alphafeat.options import KEY
    from alphamodel.backtest.config import BacktestConfig
    from alphamodel.nn.model import ModelConfig
    from alphamodel.rl.config import C51Config
    from alphamodel.rules import rule_of

    for cls in (TrainConfig, ModelConfig, BacktestConfig, C51Config):
        for f in dataclasses.fields(cls):
            o = f.metadata.get(KEY)
            assert o is not None and o.check is not None and o.help, (cls.__name__, f.name)
            assert "default" not in o.help, (cls.__name__, f.name)  # generated by --help, not written
            assert rule_of(f) is not None
    with pytest.raises(UsageError, match=r"c51\.n_atoms: expected a whole number, not text"):
        C51Config.from_dict({"n_atoms": "11"})


def test_config_values_are_checked_before_anything_is_written(cache, tmp_path):
    from alphamodel.nn.model import ModelConfig

    for bad in ({"epochs": 0}, {"batch_size": 0}, {"epochs": "3"}, {"window": 8, "burn_in": 8},
                {"horizon_weighting": "log"}, {"device": "gpu"}, {"seed": 1.5}, {"nope": 1}, {"folds": 0},
                {"context": "long"}, {"embargo": 1.0}, {"embargo": -0.1}, {"n_boot": 1}, {"baselines": ["xgboost"]},
                {"baselines": ["mlp", "mlp"]}, {"eval_piece": 0}, {"eval_warmup": -1}, {"loader_threads": 0},
                {"val_frac": 0.2}):
        with pytest.raises(UsageError, match="train"):
            TrainConfig.from_dict(bad)
    with pytest.raises(UsageError, match="model.headdim"):
        ModelConfig.from_dict({"d_model": 8, "expand": 1, "headdim": 3})
    with pytest.raises(UsageError, match="model.cfc_impl"):
        ModelConfig.from_dict({"cfc_impl": "scan"})
    assert TrainConfig.from_dict({"baselines": "logistic,mlp"}).baselines == ("logistic", "mlp")
    assert TrainConfig.from_dict({"baselines": []}).baselines == ()
    assert TrainConfig.from_dict({"window": 8}).burn_in == 2  # the default burn-in is fitted to a short window
    with pytest.raises(UsageError, match=r"train\.epochs: expected a whole number >= 1, got 0"):
        train(cache, tmp_path / "o", train_cfg=TrainConfig(epochs=0))  # the Python API checks too
    assert not (tmp_path / "o").exists()
    from alphamodel.config import read_config
    from alphamodel.errors import ConfigError

    f = tmp_path / "c.json"
    f.write_text('{"train": {"burn_in": 16}}')
    with pytest.raises(ConfigError, match=r"c\.json: train\.burn_in: .*window=8.*\(window 8 from the command line\)"):
        read_config(f, {"window": 8})  # the conflict is named with where each value came from


# ---- data-dependent bad input: one line, exit 1, before training ----------------------------
TINY = {"model": {"d_model": 8, "n_layers": 1, "d_state": 4, "headdim": 8, "chunk_size": 8, "cfc_hidden": 4},
        "train": {"window": 16, "burn_in": 4, "batch_size": 4, "epochs": 1, "steps_per_epoch": 3,
                  "baselines": ["logistic"], "n_boot": 10, "device": "cpu"}}


def _run_cli(tmp_path, root, capsys, **train):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"model": TINY["model"], "train": {**TINY["train"], **train}}))
    code = cli_main(["train", "--cache", str(root), "--out", str(tmp_path / "o"), "--config", str(cfg), "-q"])
    err = capsys.readouterr().err.strip()
    return code, err


def test_cache_without_labels_is_one_line_before_training(tmp_path, capsys):
    root = _write_cache(tmp_path / "c", sessions=3, n=60)
    m = json.loads((root / MANIFEST).read_text())
    m["params"]["horizons"] = []
    (root / MANIFEST).write_text(json.dumps(m))
    code, err = _run_cli(tmp_path, root, capsys)
    assert code == 1 and len(err.splitlines()) == 1 and "holds no labels" in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_cache_whose_labels_are_all_nan_is_one_line(tmp_path, capsys):
    root = _write_cache(tmp_path / "c", sessions=3, n=60)
    for p in root.rglob("*.arrow"):
        t = pa.ipc.open_file(pa.BufferReader(p.read_bytes())).read_all()
        for h in HORIZONS:
            i = t.column_names.index(f"label_h{h}")
            t = t.set_column(i, f"label_h{h}", pa.array(np.full(t.num_rows, np.nan, np.float32)))
        with pa.OSFile(str(p), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
            w.write_table(t)
    code, err = _run_cli(tmp_path, root, capsys)
    assert code == 1 and len(err.splitlines()) == 1 and "no label value" in err


def test_partition_missing_an_input_column_is_one_line(tmp_path, capsys):
    root = _write_cache(tmp_path / "c", sessions=3, n=60)
    p = sorted(root.rglob("*.arrow"))[1]
    t = pa.ipc.open_file(pa.BufferReader(p.read_bytes())).read_all().drop_columns(["ofi_l01"])
    with pa.OSFile(str(p), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        w.write_table(t)
    code, err = _run_cli(tmp_path, root, capsys)
    assert code == 1 and len(err.splitlines()) == 1
    assert "missing input column(s) ofi_l01" in err and p.name in err


def test_loss_going_nan_stops_with_its_step(tmp_path, capsys):
    root = _write_cache(tmp_path / "c", sessions=3, n=300)
    code, err = _run_cli(tmp_path, root, capsys, lr=1e30, warmup_steps=0, grad_clip=0.0)
    assert code == 1 and len(err.splitlines()) == 1
    assert "loss is nan at step 2" in err and "last finite loss" in err and "at step 1" in err


def _train_with_label_h5_all_up(tmp_path, capsys, session: int) -> tuple[dict, str]:
    """Train (CLI) on a 3-session cache whose session ``session`` has every h=5 label up;
    returns the summary and stderr."""
    root = _write_cache(tmp_path / "c", sessions=3, n=300)
    p = sorted(root.rglob("*.arrow"))[session]
    t = pa.ipc.open_file(pa.BufferReader(p.read_bytes())).read_all()
    i = t.column_names.index("label_h5")
    t = t.set_column(i, "label_h5", pa.array(np.ones(t.num_rows, np.float32)))
    with pa.OSFile(str(p), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        w.write_table(t)
    code, err = _run_cli(tmp_path, root, capsys)
    assert code == 0
    return json.loads((tmp_path / "o" / "summary.json").read_text()), err


def test_one_class_test_block_is_said_not_silent(tmp_path, capsys):
    """A horizon whose test block holds one class has no AUC: the summary says so in `warnings`
    and the command prints it (no NaN hidden in a table)."""
    s, err = _train_with_label_h5_all_up(tmp_path, capsys, session=-1)  # the test session
    assert any("horizon 5: no AUC for the model" in w for w in s["warnings"])
    assert "horizon 5: no AUC for the model" in err.replace("\n", " ")
    rec = [r for r in s["evaluation"] if r["model"] == "alphamodel" and r["horizon"] == 5]
    assert rec and all(r["auc"] is None for r in rec)  # null in JSON, never NaN


def test_one_class_training_rows_are_said(tmp_path, capsys):
    """A horizon whose training rows hold one class (every label up) gets a warning that the
    scores there learned nothing, though its test block has both classes and an AUC."""
    s, err = _train_with_label_h5_all_up(tmp_path, capsys, session=0)  # the training session
    said = [w for w in s["warnings"] if "horizon 5: the training rows hold one class of label" in w]
    assert said and "up): the model's and the MLP's scores there learned nothing" in said[0]
    assert "the training rows hold one class" in " ".join(err.split())
    assert not any("horizon 1:" in w and "training rows hold" in w for w in s["warnings"])


def test_summary_has_evaluation_records_for_every_model_fold_horizon(cache, tmp_path):
    from alphamodel.nn.model import ModelConfig

    tc = TrainConfig(window=16, burn_in=4, batch_size=4, epochs=1, steps_per_epoch=3, device="cpu", n_boot=20,
                     baselines=("base_rate", "logistic", "mlp"))
    s = train(cache, tmp_path / "o", ModelConfig(**TINY["model"]), tc, progress=False)
    keys = {"model", "fold", "horizon", "auc", "auc_ci_low", "auc_ci_high", "n", "base_rate"}
    ev = s["evaluation"]
    assert all(keys <= set(r) for r in ev)
    got = {(r["model"], r["fold"], r["horizon"]) for r in ev}
    for m in ("alphamodel", "base_rate", "logistic", "mlp"):
        for f in (0, "all"):
            for h in HORIZONS:
                assert (m, f, h) in got
    for r in ev:
        if r["auc"] is not None and r["auc_ci_low"] is not None:
            assert r["auc_ci_low"] <= r["auc"] <= r["auc_ci_high"]
    base = [r for r in ev if r["model"] == "base_rate" and r["fold"] == "all"]
    assert all(r["auc"] == pytest.approx(0.5) for r in base)  # a constant score: the floor
    # one test session: the bootstrap resamples its parts, and the summary says what that means
    assert any(w.startswith("the 95% intervals resample by session part") and "too narrow" in w
               for w in s["warnings"])
    b = s["folds"][0]
    assert len(s["folds"]) == 1 and any(w.startswith(f"folds: {tc.folds} asked, 1 made") for w in s["warnings"])
    assert b["test"]["sessions"] == 1 and b["train"]["rows"] == 900 and b["test"][f"positives_h{HORIZONS[0]}"] > 0
    for h in HORIZONS:  # labels kept after purging and embargo: those the three blocks hold
        assert b["labels_kept_after_purge"][f"h{h}"] == sum(b[k][f"labels_h{h}"] for k in ("train", "val", "test"))
        assert b["labels_purged"][f"h{h}"] > 0
    for h in s["horizons"]:
        assert h["best_baseline"] in ("base_rate", "logistic", "mlp") and h["lift"] is not None
        best = max(r["auc"] for r in ev if r["fold"] == "all" and r["horizon"] == h["horizon"]
                   and r["model"] in ("base_rate", "logistic", "mlp") and r["auc"] is not None)  # fmt: skip
        model = next(r["auc"] for r in ev if r["fold"] == "all" and r["horizon"] == h["horizon"]
                     and r["model"] == "alphamodel")  # fmt: skip
        assert h["lift"] == pytest.approx(model - best)  # never against a baseline below chance
        if h["lift_ci_low"] is not None:  # the sessions its interval needs to exclude 0 (alphamodel.readout)
            from alphamodel.readout import sessions_needed

            assert h["sessions_needed"] == sessions_needed(1, h["lift_ci_low"], h["lift_ci_high"])
    assert s["test_sessions"] == 1 and s["ceiling_note"] is None  # a hand cache: no generator ceiling


def test_ceiling_note_says_where_the_ceiling_comes_from(tmp_path):
    from alphamodel.supervised.baselines import ceiling_note

    rep = tmp_path / "synth-report.json"
    rep.write_text(json.dumps({"auc_ceiling": {"states": 192, "session": "2024-01-09", "instrument": "ESH4",
                                               "paths_per_state": {"30": 512}, "auc": {"30": 0.6},
                                               "interval_95": {"30": [0.58, 0.62]}}}))
    note = ceiling_note(str(rep))
    assert "192 saved states of one session (2024-01-09, ESH4)" in note and "30: [0.580, 0.620]" in note
    assert "not above the true model" in note
    assert ceiling_note(None) is None and ceiling_note(str(tmp_path / "absent.json")) is None


def test_stateful_scoring_equals_each_run_as_one_sequence(cache):
    """score_rows (stateful): runs of different lengths batched together, cut in windows of K,
    right-padded, state carried — the scores of running each run as one long sequence."""
    from alphamodel.nn.model import AlphaModel, ModelConfig
    from alphamodel.supervised.scoring import score_rows

    d = CacheData.open(cache)
    torch.manual_seed(0)
    norm = d.fit_normaliser(np.arange(900))
    model = AlphaModel(ModelConfig(n_features=len(norm.names), n_horizons=2, **TINY["model"], dropout=0.0)).eval()
    rows = np.r_[100:900, 900:1400]  # 800 rows of session 0 and 500 of session 1
    tc = TrainConfig(window=48, context="stateful", eval_piece=10_000, eval_warmup=0, eval_batch_size=2)
    r, p, _ = score_rows(model, d, rows, norm, tc, torch.device("cpu"))
    assert r.tolist() == rows.tolist()
    for seg, a, b in ((0, 100, 900), (1, 0, 500)):
        bt = d.batch([Window(seg, a, b)], b - a, norm)
        with torch.no_grad():
            ref = torch.sigmoid(model(torch.from_numpy(bt.x), torch.from_numpy(bt.dt))).numpy()[0]
        got = p[np.searchsorted(r, d.offsets[seg] + np.arange(a, b))]
        assert np.allclose(got, ref, rtol=0, atol=1e-5)
    # with pieces and a warm-up, a row's score sees the warm-up rows as context (close, not equal)
    tc2 = TrainConfig(window=48, context="stateful", eval_piece=200, eval_warmup=100, eval_batch_size=3)
    r2, p2, _ = score_rows(model, d, rows, norm, tc2, torch.device("cpu"))
    assert r2.tolist() == rows.tolist() and np.isfinite(p2).all()


def test_embeddings_are_the_stateful_scores_inputs(cache):
    """embed_segments scores as training scored (stateful: the state carried across windows):
    its probabilities are score_rows' and its embedding is the one long sequence's; with
    context "window" (no state) the rows past the first window differ."""
    from alphamodel.nn.model import AlphaModel, ModelConfig
    from alphamodel.supervised.embed import embed_segments
    from alphamodel.supervised.scoring import score_rows

    d = CacheData.open(cache)
    torch.manual_seed(0)
    norm = d.fit_normaliser(np.arange(900))
    model = AlphaModel(ModelConfig(n_features=len(norm.names), n_horizons=2, **TINY["model"], dropout=0.0)).eval()
    meta = {"window": 48, "burn_in": 8, "context": "stateful", "eval_piece": 10_000, "eval_warmup": 0}
    emb, prob = embed_segments(model, norm, d, [1], meta, torch.device("cpu"))[1]
    n = d.segments[1].n
    assert emb.shape == (n, TINY["model"]["cfc_hidden"] + TINY["model"]["d_model"]) and prob.shape == (n, 2)
    _, p, _ = score_rows(model, d, d.segment_rows([1]), norm, TrainConfig(**meta), torch.device("cpu"))
    assert np.allclose(prob, p, rtol=0, atol=1e-6)
    bt = d.batch([Window(1, 0, n)], n, norm)
    with torch.no_grad():
        ref, _ = model.embedding(torch.from_numpy(bt.x), torch.from_numpy(bt.dt))
    assert np.allclose(emb, ref.numpy()[0], rtol=0, atol=1e-5)
    win, _ = embed_segments(model, norm, d, [1], {**meta, "context": "window"}, torch.device("cpu"))[1]
    assert not np.allclose(win[100:], emb[100:], rtol=0, atol=1e-5)


def test_staged_outputs_name_what_they_replace_and_what_an_earlier_run_left(tmp_path):
    from alphamodel.supervised.outputs import staged_outputs

    out = tmp_path / "o"
    with staged_outputs(out) as st:  # a first run: a plot per cost level
        for name in ("summary.json", "equity_cost0.png", "equity_cost0.25.png"):
            (st.dir / name).write_text("1")
    with staged_outputs(out) as st:  # a rerun with fewer cost levels
        (st.dir / "equity_cost0.png").write_text("2")
        assert st.replacing("summary.json") == ["equity_cost0.png", "summary.json"]
        assert st.left_over("summary.json") == ["equity_cost0.25.png"]
        (st.dir / "summary.json").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["equity_cost0.25.png", "equity_cost0.png", "summary.json"]
    assert (out / "summary.json").read_text() == "2" and (out / "equity_cost0.25.png").read_text() == "1"
    try:  # a failed run keeps nothing of its own and removes the folder it made
        with staged_outputs(tmp_path / "new") as st:
            (st.dir / "summary.json").write_text("x")
            raise RuntimeError("stop")
    except RuntimeError:
        pass
    assert not (tmp_path / "new").exists()


def test_lift_bar_is_never_below_chance() -> None:
    """The lift is over the best baseline, and at least over chance (0.5, a constant score):
    a baseline scoring below 0.5, or a base rate whose AUC is NaN (a fold without training
    labels), does not lower the bar; a real baseline above 0.5 is the bar with paired replicates."""
    from alphamodel.supervised.report import lift

    names = ["alphamodel", "base_rate", "mlp", "logistic"]
    reps = np.array([[0.60, 0.5, 0.40, np.nan], [0.62, 0.5, 0.44, np.nan], [0.58, 0.5, 0.42, np.nan]])
    got = lift(names, np.array([0.60, np.nan, 0.42, np.nan]), reps)
    assert got["best_baseline"] == "base_rate" and got["lift"] == pytest.approx(0.10)
    assert got["lift_ci_low"] == pytest.approx(0.081) and got["lift_ci_high"] == pytest.approx(0.119)
    got = lift(names, np.array([0.60, 0.5, 0.55, 0.52]), reps)
    assert got["best_baseline"] == "mlp" and got["lift"] == pytest.approx(0.05)
