"""alphamodel backtest: C51 projection, environment by hand, Thompson, Sharpe statistics, folds,
fine-tuning, the CLI end to end on the embedded sample and its bad inputs."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from hand_cache import write_hand_cache

from alphafeat.synth.planted import asof
from alphamodel.backtest.env import VecEnv
from alphamodel.backtest.execution import book_from_arrays
from alphamodel.backtest.market import market_from_arrays
from alphamodel.backtest.metrics import expected_max_sharpe, kelly_size, max_drawdown, psr, sharpe, sharpe_stats
from alphamodel.cli import main as cli_main
from alphamodel.rl.c51 import (
    C51Net,
    NStep,
    aux_loss,
    balanced_accuracy,
    class_weights,
    project,
    project_slow,
    support,
    thompson,
)


# ---- C51 projection (reference-values.md: Bellemare et al. 2017, worked by hand) -------------
def test_projection_hand_values_and_terminal():
    z = support(5, -2.0, 2.0)
    p = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]] * 2)
    m = project(p, torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.0]), z)
    assert m[0].tolist() == pytest.approx([0.03, 0.15, 0.32, 0.32, 0.18], abs=1e-6)
    assert float((m[0] * z).sum()) == pytest.approx(0.47, abs=1e-6)
    assert m[1].tolist() == pytest.approx([0, 0, 0.5, 0.5, 0], abs=1e-6)  # terminal: T z = 0.5


def test_projection_l_equals_u_keeps_mass():
    z = support(5, -2.0, 2.0)
    p = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    m = project(p, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), z)  # atoms land on atoms
    assert m[0].tolist() == pytest.approx([0, 0, 0, 0, 1.0])
    assert m[1].tolist() == pytest.approx([0, 0.2, 0.2, 0.2, 0.4])  # shifted by one atom, the top clipped


def test_projection_random_mass_mean_and_slow_reference():
    g = torch.Generator().manual_seed(1)
    z = support(51, -10.0, 10.0)
    p = torch.softmax(torch.randn(64, 51, generator=g) * 2, -1)
    r = torch.randn(64, generator=g) * 6
    disc = torch.where(torch.rand(64, generator=g) < 0.2, 0.0, 0.97 ** 3)
    r[:4] = torch.tensor([0.0, 0.4, -10.0, 25.0])  # exact atoms and clipped ends
    m = project(p, r, disc, z)
    assert torch.allclose(m.sum(-1), torch.ones(64), atol=1e-5)
    clipped_mean = (p * (r[:, None] + disc[:, None] * z).clamp(-10, 10)).sum(-1)
    assert torch.allclose((m * z).sum(-1), clipped_mean, atol=1e-4)
    ref = torch.tensor(project_slow(p.tolist(), r.tolist(), disc.tolist(), z.tolist()))
    assert torch.allclose(m, ref, atol=1e-5)


def test_nstep_returns_stop_at_done():
    ns = NStep(3, 0.5)
    s = {"row": torch.tensor([0, 10])}
    outs = [ns.push(s, torch.tensor([1, 2]), torch.tensor([1.0, 1.0]), torch.tensor(d), s)
            for d in ([0.0, 0.0], [0.0, 1.0], [0.0, 0.0])]
    assert outs[0] is None and outs[1] is None
    o = outs[2]
    assert o["reward"].tolist() == pytest.approx([1 + 0.5 + 0.25, 1 + 0.5])  # env 1 ended at step 2
    assert o["disc"].tolist() == pytest.approx([0.125, 0.0])


# ---- Thompson sampling --------------------------------------------------------------------
def test_thompson_picks_in_proportion_to_probability_of_being_best():
    z = support(5, -2.0, 2.0)
    probs = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1], [0.3, 0.0, 0.0, 0.3, 0.4], [0.0, 0.0, 0.0, 1.0, 0.0]])
    exact = np.zeros(3)  # enumerate the joint draws; argmax takes the first action on a tie
    for idx in itertools.product(range(5), repeat=3):
        w = float(np.prod([probs[a, i] for a, i in enumerate(idx)]))
        exact[int(np.argmax([z[i] for i in idx]))] += w
    n = 200_000
    pick = thompson(probs.expand(n, 3, 5), z, torch.Generator().manual_seed(0))
    freq = torch.bincount(pick, minlength=3).numpy() / n
    se = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(freq - exact) < 5 * se + 1e-9), (freq, exact)
    assert exact.sum() == pytest.approx(1.0)
    # non-trivial: the greedy mean picks action 2 (mean 1.0 vs 0.5 for action 1) only, while
    # Thompson takes action 1 most often (it beats a sure 1 whenever it draws a 2)
    assert exact[1] == pytest.approx(0.57, abs=1e-6) and exact[2] == pytest.approx(0.21, abs=1e-6)


# ---- environment by hand ---------------------------------------------------------------------
BID = np.array([100.00, 100.25, 100.50, 100.25, 100.75])
ASK = BID + 0.25


def _env(targets_per_step, fee=0.1, stride=2):
    m = market_from_arrays([BID], [ASK], tick=0.25, tick_value=12.5)
    n = len(targets_per_step[0])
    env = VecEnv(m, n, stride)
    env.reset(torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long), torch.full((n,), fee))
    rewards, dones = [], []
    for tg in targets_per_step:
        r, d = env.step(torch.tensor(tg, dtype=torch.float32))
        rewards.append(r.tolist())
        dones.append(d.tolist())
    return env, np.array(rewards), dones


def test_env_pnl_costs_and_fills_by_hand():
    # env 0: long at row 0 (ask 100.25), flat at row 2 (bid 100.50); env 1: long held to the end
    # (closed at row 4's bid 100.75); env 2: short held to the end (sold 100.00, bought 101.00)
    env, r, dones = _env([[1, 1, -1], [0, 1, -1]])
    # step 1: half spread 0.5 + fee 0.1 to enter; mid 100.125 -> 100.625 = 2 ticks
    assert r[0].tolist() == pytest.approx([2 - 0.6, 2 - 0.6, -2 - 0.6])
    # step 2: env 0 exits (0.6); env 1 gains 1 tick and is closed at the end (0.6); env 2 -1 - 0.6
    assert r[1].tolist() == pytest.approx([-0.6, 1 - 0.6, -1 - 0.6])
    assert dones == [[False] * 3, [True] * 3]
    # totals equal the cash accounting: fills at bid/ask, fee per side
    cash = [(100.50 - 100.25) / 0.25 - 0.2, (100.75 - 100.25) / 0.25 - 0.2, (100.00 - 101.00) / 0.25 - 0.2]
    assert env.pnl.tolist() == pytest.approx(cash)
    assert (env.pnl * env.m.tick_value).tolist() == pytest.approx([c * 12.5 for c in cash])  # 0.8 tick = 10 USD
    assert env.pos.tolist() == [0, 0, 0]  # flat at the session end
    assert env.entries.tolist() == [1, 1, 1] and env.turnover.tolist() == [2, 2, 2]
    assert env.wins.tolist() == [1, 1, 0] and env.closed.tolist() == [1, 1, 1]


def test_no_position_across_a_session_end():
    # two sessions; the second opens 40 points higher: a position must never earn that gap
    bids = [np.full(6, 100.0) + 0.25 * np.arange(6), np.full(6, 140.0)]
    m = market_from_arrays(bids, [b + 0.25 for b in bids], tick=0.25)
    env = VecEnv(m, 1, stride=4)
    env.reset(torch.tensor([True]), torch.tensor([0]), torch.tensor([0.0]))
    total = 0.0
    for _ in range(4):
        r, d = env.step(torch.tensor([1.0]))
        total += float(r)
        assert int(env.t) <= 5  # never steps into the next session
        if bool(d):
            assert float(env.pos) == 0.0
    # long from row 0 to the end of session 1: 5 ticks of mid, 0.5 tick half spread each way, then
    # repeated entries at the last row are closed at once (cost 1 tick each, no gain)
    assert total == pytest.approx(5 - 1.0 - 2 * 1.0)


def test_kelly_size_formula():
    s = kelly_size(torch.tensor([1.0, 1.0, -1.0, 1.0]), torch.tensor([0.1, float("nan"), 0.1, 0.01]), 100.0,
                   k=2.0, max_size=2.0, var_floor=0.25)
    # var = 0.01 * 100 = 1 -> 2 * 1 / 1 = 2; NaN vol -> floor 0.25 -> 8 clipped to 2; negative edge -> 0
    assert s.tolist() == pytest.approx([2.0, 2.0, 0.0, 2.0])
    assert float(kelly_size(torch.tensor([0.25]), torch.tensor([0.1]), 100.0)) == pytest.approx(0.5)


# ---- Sharpe statistics (reference-values.md: Bailey & López de Prado 2012, 2014) -------------
def test_psr_and_deflated_sharpe_worked_example():
    assert psr(0.1, 252, -0.5, 4.0) == pytest.approx(0.9383, abs=1e-4)
    sr_star = expected_max_sharpe(0.002, 20)
    assert sr_star == pytest.approx(0.0850, abs=1e-4)
    assert psr(0.1, 252, -0.5, 4.0, sr_star) == pytest.approx(0.5914, abs=1e-4)


def test_annualised_sharpe_and_drawdown():
    d = np.array([1.0, -0.5, 2.0, 0.5])
    assert sharpe(d) == pytest.approx(d.mean() / d.std(ddof=1))
    st = sharpe_stats(d, np.array([0.1, 0.2, sharpe(d)]))
    assert st["sharpe"] == pytest.approx(sharpe(d) * math.sqrt(252))
    assert 0 < st["deflated_sharpe"] < st["psr"] < 1  # deflating by trials lowers it
    assert math.isnan(sharpe(np.array([3.0])))
    assert max_drawdown(np.array([1.0, 3.0, 0.5, 2.0, -1.0])) == pytest.approx(4.0)


# ---- folds ------------------------------------------------------------------------------------
def test_folds_never_train_at_or_after_test_and_purge_overlaps():
    from alphamodel.backtest.walkforward import fold_sessions

    starts = np.arange(8) * 100
    ends = starts + 90
    ends[3] = 420  # session 3 runs into session 4
    folds = fold_sessions(starts, ends, 3)
    assert [te.tolist() for _, te in folds] == [[2, 3], [4, 5], [6, 7]]
    assert [tr.tolist() for tr, _ in folds] == [[0, 1], [0, 1, 2], [0, 1, 2, 3, 4, 5]]  # 3 purged for [4, 5]
    folds = fold_sessions(starts, ends, 3, embargo=1)
    assert [tr.tolist() for tr, _ in folds] == [[0], [0, 1, 2], [0, 1, 2, 3, 4]]
    for tr, te in folds:
        assert tr.max() < te.min() - 1  # never at or after the test block, one session between
        assert np.all(ends[tr] <= starts[te.min()])  # no training span reaches the test block


# ---- fine-tune path: encoder weights change, gradients finite ----------------------------------
def test_fine_tune_changes_the_encoder_with_finite_grads(tmp_path):
    from alphamodel.backtest.config import BacktestConfig
    from alphamodel.data.cache import CacheData
    from alphamodel.nn.model import AlphaModel, ModelConfig
    from alphamodel.rl.learner import EncoderObs, Learner

    root = _hand_cache(tmp_path / "c", sessions=1, n=200)
    data = CacheData.open(root)
    norm = data.fit_normaliser(np.arange(data.n_rows))
    torch.manual_seed(0)
    model = AlphaModel(ModelConfig(n_features=len(norm.names), n_horizons=2, d_model=16, n_layers=1, d_state=8,
                                   headdim=8, chunk_size=16, cfc_hidden=8, dropout=0.0))
    D = 8 + 16
    obs = EncoderObs(model, norm, data, 16, torch.zeros(D), torch.ones(D), 0.5)
    net = C51Net(D + 2)
    opt = torch.optim.Adam([*net.parameters(), *model.parameters()], lr=1e-2)
    cfg = BacktestConfig()
    z = support(51, -20, 20)
    tb = torch.zeros(data.n_rows, dtype=torch.long)
    learner = Learner(net, C51Net(D + 2), obs, z, opt, tb, cfg.c51)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    k = 8
    batch = {"s_row": torch.arange(20, 20 + k), "s_pos": torch.zeros(k), "s_fee": torch.zeros(k),
             "n_row": torch.arange(40, 40 + k), "n_pos": torch.zeros(k), "n_fee": torch.zeros(k),
             "action": torch.randint(0, 3, (k,)), "reward": torch.randn(k), "disc": torch.full((k,), 0.9)}
    learner.learn(batch, torch.Generator().manual_seed(0))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert "embed.weight" in changed and any(n.startswith("cfc") for n in changed)


# ---- a hand-made cache for the bad inputs ----------------------------------------------------------
def _hand_cache(root, sessions=3, n=400, seed=0, drop=()):
    rng = np.random.default_rng(seed)
    tables = []
    for s in range(sessions):
        mid = 5000 + 0.25 * np.concatenate([[0.0], np.cumsum(rng.choice([-1.0, 1.0], n - 1))])
        ts = (np.datetime64(f"2024-03-0{s + 4}T14:00:00", "ns").astype(np.int64)
              + np.cumsum(rng.integers(1_000_000, 50_000_000, n)))
        cols = {"ts_recv": pa.array(ts, pa.timestamp("ns", tz="UTC")), "mid": pa.array(mid),
                "bid_px_00": pa.array(mid - 0.125), "ask_px_00": pa.array(mid + 0.125),
                "imbalance_l1": pa.array(rng.uniform(-1, 1, n)), "ofi_l01": pa.array(rng.normal(size=n)),
                "realized_vol_60s": pa.array(np.full(n, 0.2)),
                "tb_label": pa.array(rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32)),
                "bid_sz_00": pa.array(rng.integers(1, 30, n).astype(np.float64)),
                "ask_sz_00": pa.array(rng.integers(1, 30, n).astype(np.float64)),
                "buy_volume": pa.array(rng.choice([0.0, 0.0, 1.0, 5.0, 20.0], n)),
                "sell_volume": pa.array(rng.choice([0.0, 0.0, 1.0, 5.0, 20.0], n))}
        for h in (2, 5):
            cols[f"label_h{h}"] = pa.array(rng.choice([0.0, 1.0], n).astype(np.float32))
        for c in drop:
            cols.pop(c)
        tables.append(cols)
    columns = [{"name": "mid", "unit": "index points", "source": "standard"},
               {"name": "bid_px_00", "unit": "index points", "source": "book"},
               {"name": "ask_px_00", "unit": "index points", "source": "book"}]
    return write_hand_cache(root, tables, columns, [2, 5])


def _one_error(capsys, argv, status=1):
    assert cli_main(argv) == status
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_inputs_one_line_nothing_written(tmp_path, capsys):
    """Option values out of range are usage errors (exit 2, issue 17; every option's bad values
    are in tests/test_cli_options.py); what the cache or checkpoint cannot give is exit 1."""
    good = _hand_cache(tmp_path / "good")
    out = tmp_path / "o"
    base = ["backtest", "--cache", str(good), "--out", str(out), "-q"]
    usage = 2
    assert "argument --costs: expected distinct numbers of ticks in [0, 10]" in _one_error(
        capsys, base + ["--costs", "0,-0.5"], usage)
    assert "got '0,50'" in _one_error(capsys, base + ["--costs", "0,50"], usage)
    assert "comma-separated, got '0,x'" in _one_error(capsys, base + ["--costs", "0,x"], usage)
    assert "argument --stride: expected a number of rows >= 1" in _one_error(capsys, base + ["--stride", "0"], usage)
    # out of range for this cache's sessions, too few sessions for the folds: data errors
    err = _one_error(capsys, base + ["--stride", "400"])
    assert 'stride 400 (--stride, or "stride" in --config): out of range' in err
    assert "too few" in _one_error(capsys, base + ["--folds", "3"])
    # on the embedded sample (no --cache): refused before its cache is built in OUT
    assert "--folds 9: 3 session(s) are too few" in _one_error(capsys, ["backtest", "--out", str(out), "--folds", "9"])
    assert not out.exists()
    nobook = _hand_cache(tmp_path / "nobook", drop=("bid_px_00",))
    assert "missing column(s) bid_px_00" in _one_error(capsys, ["backtest", "--cache", str(nobook), "--out",
                                                                str(out), "-q"])
    novol = _hand_cache(tmp_path / "novol", drop=("realized_vol_60s",))
    assert "--no-kelly" in _one_error(capsys, ["backtest", "--cache", str(novol), "--out", str(out), "-q"])
    # a checkpoint whose weights do not fit its config, and one that reads features the cache lacks
    from alphamodel.nn.model import ModelConfig
    from alphamodel.supervised.config import TrainConfig
    from alphamodel.supervised.train import train

    mdir = tmp_path / "m"
    train(good, mdir, ModelConfig(d_model=16, n_layers=1, d_state=8, headdim=8, chunk_size=16, cfc_hidden=8),
          TrainConfig(window=16, burn_in=4, epochs=1, steps_per_epoch=2, device="cpu"), progress=False)
    # alphamodel embed: per-row embeddings beside the cache; a second run refuses to replace them
    assert cli_main(["embed", str(good), "--model", str(mdir)]) == 0
    emb = tmp_path / "good-embeddings"
    tab = pa.ipc.open_file(str(emb / "root=ES/session=2024-03-04/ESH4.arrow")).read_all()
    assert tab.num_rows == 400 and "emb_023" in tab.column_names and "p_h5" in tab.column_names
    assert np.isfinite(tab.column("emb_000").to_numpy()).all()
    seen = json.loads((emb / "_embeddings.json").read_text())["model_sessions_seen"]
    assert seen and seen == json.loads((mdir / "config.json").read_text())["sessions_seen"]
    assert "exists" in _one_error(capsys, ["embed", str(good), "--model", str(mdir)])
    capsys.readouterr()
    # a given model serves every fold (its embeddings computed once); the summary says it must predate the tests
    ok = tmp_path / "ok"
    assert cli_main(["backtest", "--cache", str(good), "--model", str(mdir), "--out", str(ok), "-q", "--stride", "50",
                     "--policy-steps", "6", "--envs", "8", "--costs", "0,0.5", "--device", "cpu"]) == 0
    s = json.loads((ok / "summary.json").read_text())
    # the model trained and early-stopped on this cache's early sessions: the folds testing on them are named
    assert "it trained or early-stopped on test sessions of fold(s) 0 (" in s["notes"]["model"]
    assert "those folds are in sample" in " ".join(capsys.readouterr().err.split())  # said, not only in the file

    assert {(r["fold"], r["cost_ticks"]) for r in s["results"]} == {(0, 0.0), (0, 0.5), (1, 0.0), (1, 0.5)}
    capsys.readouterr()
    noimb = _hand_cache(tmp_path / "noimb", drop=("imbalance_l1",))
    assert "lacks: imbalance_l1" in _one_error(capsys, ["backtest", "--cache", str(noimb), "--model", str(mdir),
                                                        "--out", str(out), "-q"])
    cfg = json.loads((mdir / "config.json").read_text())
    cfg["model"]["d_model"] = 24
    (mdir / "config.json").write_text(json.dumps(cfg))
    assert "do not match" in _one_error(capsys, base + ["--model", str(mdir)])
    assert not out.exists()  # nothing written, not even the directory


def test_given_model_note_names_the_folds_it_saw():
    from alphamodel.backtest.report import given_model_note

    tests = [{"2024-03-05"}, {"2024-03-06", "2024-03-07"}]
    assert "out of sample" in given_model_note("m", ["2024-03-01", "2024-03-04"], tests)
    inside = given_model_note("m", ["2024-03-04", "2024-03-06"], tests)
    assert "fold(s) 1 (2024-03-06)" in inside and "in sample" in inside
    assert "does not record its sessions" in given_model_note("m", None, tests)


def test_fill_modes_end_to_end_and_their_bad_options(tmp_path, capsys):
    """--fill taker,mid,passive: one policy per mode; taker as a taker-only run; the rules' mid
    PnL is their taker PnL plus half a spread (0.5 tick here) per contract traded; passive reports
    its fills. Bad fill options are usage errors (exit 2), a cache without the touch's sizes and
    traded volume refuses passive (exit 1); nothing written."""
    good = _hand_cache(tmp_path / "good")
    out = tmp_path / "o"
    base = ["backtest", "--cache", str(good), "--out", str(out), "-q"]
    for opt, val in (("--fill", "maker"), ("--fill", "taker,taker"), ("--queue", "power:0"), ("--queue", "fifo"),
                     ("--latency-ns", "-1"), ("--timeout", "0"), ("--on-timeout", "wait"), ("--fee-maker", "-1"),
                     ("--fee-taker", "1000")):
        assert f"argument {opt}:" in _one_error(capsys, base + [opt, val], 2)
    novol = _hand_cache(tmp_path / "novol", drop=("buy_volume",))
    err = _one_error(capsys, ["backtest", "--cache", str(novol), "--out", str(out), "-q", "--fill", "passive"])
    assert "missing column(s) buy_volume: --fill passive needs" in err
    assert not out.exists()
    run = ["--stride", "50", "--policy-steps", "4", "--envs", "8", "--costs", "0,0.25", "--device", "cpu",
           "--seed", "0"]
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"encoder_epochs": 1, "encoder_steps": 2, "c51": {"batch_size": 16, "hidden": 16},
                               "plots": False}))
    assert cli_main(base + run + ["--config", str(cfg), "--fill", "taker,mid,passive", "--queue", "power:2",
                                  "--timeout", "20", "--on-timeout", "cross", "--fee-maker", "0.5"]) == 0
    cap = capsys.readouterr()
    err, out_text = " ".join(cap.err.split()), " ".join(cap.out.split())
    assert "fills: taker, mid, passive; cost in ticks per contract per side" in out_text
    assert "cost = ticks per contract per side" in out_text and "maker 0.5 USD = 0.04 ticks" in err
    assert "PBO at cost 0.25, passive fills:" in out_text and "mid (bound)" in out_text
    s = json.loads((out / "summary.json").read_text())
    assert set(s["pbo"]) == {"taker", "mid", "passive"} and all(set(v) == {"0", "0.25"} for v in s["pbo"].values())
    assert {(p["fill"], p["cost_ticks"]) for p in s["pooled"]} == {(m, c) for m in ("taker", "mid", "passive")
                                                                  for c in (0.0, 0.25)}
    by = {(r["strategy"], r["fill"], r["fold"], r["cost_ticks"]): r for r in s["results"]}
    assert {k[1] for k in by} == {"taker", "mid", "passive"}
    for (name, fill, fold, cost), r in by.items():
        if fill == "mid" and not name.startswith("c51"):
            t = by[(name, "taker", fold, cost)]
            assert r["turnover"] == t["turnover"]
            assert r["pnl_ticks"] == pytest.approx(t["pnl_ticks"] + 0.5 * t["turnover"] * r["sessions"], abs=1e-3)
    rates = [r["fill_fill_rate"] for k, r in by.items() if k[1] == "passive" and r["fill_fill_rate"] is not None]
    assert rates and all(0 <= x <= 1 for x in rates) and max(rates) > 0
    assert all(r["fill_fill_rate"] == 1 for k, r in by.items() if k[1] != "passive" and r["turnover"] > 0)
    assert (out / "policy_fold0_passive.safetensors").is_file() and (out / "policy_fold0.safetensors").is_file()
    solo = tmp_path / "solo"
    assert cli_main(["backtest", "--cache", str(good), "--out", str(solo), "-q", *run, "--config", str(cfg)]) == 0
    for r in json.loads((solo / "summary.json").read_text())["results"]:
        # fold 0 alike; later folds' encoders draw from a random state the other modes' policies moved
        if r["fold"] == 0 or r["strategy"] in ("flat", "long", "ofi-sign", "logistic", "hindsight"):
            want = by[(r["strategy"], "taker", r["fold"], r["cost_ticks"])]["pnl_ticks"]
            assert r["pnl_ticks"] == pytest.approx(want, abs=1e-6), r


# ---- the CLI end to end on the embedded default sample ----------------------------------------------
def test_backtest_cli_end_to_end_on_the_embedded_sample(tmp_path, capsys):
    from alphafeat.precompute import DEFAULT_DATA_DIR

    if not any(DEFAULT_DATA_DIR.glob("*.dbn.zst")):
        pytest.skip("the embedded default sample (data/) is absent")
    out = tmp_path / "bt"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"encoder_epochs": 1, "encoder_steps": 4, "finetune_steps": 6,
                               "c51": {"batch_size": 64, "hidden": 32}}))
    rc = cli_main(["backtest", "--out", str(out), "--policy-steps", "12", "--envs", "16", "--costs", "0,0.25",
                   "--fine-tune", "--config", str(cfg), "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "3 sessions -> 2 walk-forward folds" in captured.err
    err, out_text = " ".join(captured.err.split()), " ".join(captured.out.split())
    assert "only in folds with at least 10 test sessions" in err  # one test session a fold: no Sharpe
    assert "fills: taker; cost in ticks per contract per side" in out_text
    assert "taker: buys at the ask, sells at the bid (half a spread per side)" in out_text  # what a fill pays
    assert "Sharpe over the 0 of 2 folds" in out_text
    s = json.loads((out / "summary.json").read_text())
    strategies = {r["strategy"] for r in s["results"]}
    assert {"c51", "c51-unit", "c51-finetune", "flat", "long", "ofi-sign", "logistic", "direction-head",
            "hindsight"} <= strategies
    assert len(s["results"]) == len(strategies) * 2 * 2  # strategy x fold x cost
    for r in s["results"]:
        assert set(s["columns"]) <= set(r)
        if r["strategy"] == "flat":
            assert r["pnl_ticks"] == 0 and r["turnover"] == 0
    for f in s["folds"]:  # trained on rows strictly before the test rows
        assert f["train_rows"][1] < f["test_rows"][0]
        assert max(f["train_sessions"]) < min(f["test_sessions"])
        assert f["fine_tune"]["grads_finite"] and f["fine_tune"]["encoder_abs_change"] > 0
    assert s["aux_head"][0]["available"] and s["aux_head_verdict"]["folds"][0] == 0
    for a in s["aux_head"]:
        if a["available"]:
            assert 0 <= a["test_balanced_accuracy"] <= 1 and len(a["loss_weights"]) == 3
            assert a["balanced_accuracy_ci"][0] <= a["test_balanced_accuracy"] <= a["balanced_accuracy_ci"][1]
    if not s["aux_head"][0]["learns"]:  # walk-forward: a head that did not learn is not trained after
        assert not s["aux_head"][1]["available"] and "does not learn" in s["aux_head_verdict"]["note"]
    assert all(r["sharpe"] is None for r in s["results"]) and s["folds_reporting_sharpe"] == 0
    assert all(a["folds"] == 0 and a["folds_run"] == 2 for a in s["aggregate"])
    pooled = {(p["strategy"], p["fill"], p["cost_ticks"]): p for p in s["pooled"]}
    assert pooled[("flat", "taker", 0.0)]["pnl_per_session"] == 0 and pooled[("long", "taker", 0.25)]["sessions"] == 2
    assert set(s["pbo"]) == {"taker"} and set(s["pbo"]["taker"]) == {"0", "0.25"}  # per fill mode, then cost
    assert s["pbo"]["taker"]["0.25"]["pbo"] is None and "at least 4" in s["pbo"]["taker"]["0.25"]["note"]  # 2 tests
    assert s["fill"]["modes"] == ["taker"] and "ticks per contract per side" in s["fill"]["pays"]
    assert s["notes"]["oracle"].startswith("oracle not available")  # data/ has no planted-signal sidecar
    assert not strategies & {"oracle", "oracle-m0.5", "oracle-band"}
    assert s["notes"]["deflated_sharpe"].endswith("(all but hindsight)")  # names no oracle that did not run
    assert len(s["plots"]) == 4 and all((out / p).is_file() for p in s["plots"])
    for k in range(2):
        assert (out / f"policy_fold{k}.safetensors").is_file()
    assert (out / "policy_config.json").is_file()
    assert not list(out.glob(".partial-*"))


# ---- the Python API checks as the CLI does (issue 17's error family) ----------------------------
def test_python_api_refuses_bad_values_with_the_error_family(tmp_path, capsys):
    from alphafeat.errors import UsageError
    from alphamodel.backtest import BacktestConfig, backtest
    from alphamodel.errors import DataError
    from alphamodel.rl.config import C51Config

    out = tmp_path / "o"
    for cfg, key in ((BacktestConfig(stride=0), "stride"), (BacktestConfig(costs=(0.0, 11.0)), "costs"),
                     (BacktestConfig(folds=1), "folds"), (BacktestConfig(device="tpu"), "device"),
                     (BacktestConfig(c51=C51Config(v_min=1.0, v_max=-1.0)), "c51.v_min")):
        with pytest.raises(UsageError) as e:
            backtest(tmp_path / "nocache", out, None, cfg, progress=False)
        assert e.value.option == key and e.value.exit_code == 2
    with pytest.raises(UsageError, match=r"c51: unknown key\(s\) atoms"):
        C51Config.from_dict({"atoms": 51})
    with pytest.raises(UsageError, match="stride: expected a number of rows >= 1, got 0"):
        VecEnv(market_from_arrays([BID], [ASK], tick=0.25), 1, 0)
    with pytest.raises(DataError, match="^/x/s1.arrow: no valid bid or ask quote"):
        market_from_arrays([BID, BID], [ASK, np.full(5, np.nan)], 0.25, paths=["/x/s0.arrow", "/x/s1.arrow"])
    assert not out.exists()
    # a model directory whose config.json is not JSON: one line naming it, exit 1
    good = _hand_cache(tmp_path / "good", sessions=3, n=100)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\0" * 16)
    rc = cli_main(["backtest", "--cache", str(good), "--model", str(tmp_path / "m"), "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "config.json: not an alphamodel config" in err, err
    assert not out.exists()


# ---- the K=3 trade-outcome head: inverse class frequency -------------------------------------
def test_aux_class_weights_balanced_accuracy_and_weighted_loss():
    y = torch.tensor([0, 1, 1, 1, 1, 1, 1, 2, -1, -1])  # 8 defined: 1 stop, 6 timeouts, 1 profit
    w = class_weights(y)
    assert w.tolist() == pytest.approx([8 / 3, 8 / 18, 8 / 3])  # n / (k n_c)
    n_c = torch.tensor([1.0, 6.0, 1.0])
    assert (w * n_c).tolist() == pytest.approx([8 / 3] * 3)  # every class carries n / k
    assert class_weights(torch.tensor([1, 1, 2])).tolist() == pytest.approx([0.0, 0.5, 1.0])  # absent: 0
    assert class_weights(torch.tensor([-1, -1])).tolist() == [1.0, 1.0, 1.0]
    majority = torch.ones(8, dtype=torch.long)
    assert balanced_accuracy(majority, y[y >= 0]) == pytest.approx(1 / 3)
    assert float((majority == y[y >= 0]).float().mean()) == pytest.approx(0.75)
    assert balanced_accuracy(torch.tensor([0, 1, 0, 1, 1, 1, 1, 2]), y[y >= 0]) == pytest.approx((1 + 5 / 6 + 1) / 3)
    logits = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    ok = y >= 0
    nll = -torch.log_softmax(logits[ok], -1)[torch.arange(8), y[ok]]
    ref = (w[y[ok]] * nll).sum() / w[y[ok]].sum()
    assert float(aux_loss(logits, y, w)) == pytest.approx(float(ref), rel=1e-6)
    assert float(aux_loss(logits, y)) == pytest.approx(float(nll.mean()), rel=1e-6)


# ---- the oracle on generated markets -----------------------------------------------------------
def test_asof_join_never_looks_ahead():
    ts = np.array([10, 20, 20, 35], np.int64)  # two values stamped at 20: the later one wins
    v = np.array([0.6, 0.4, 0.7, 0.55])
    rows = np.array([5, 10, 19, 20, 34, 35, 100], np.int64)
    got = asof(rows, ts, v)
    assert np.isnan(got[0])
    assert got[1:].tolist() == [0.6, 0.6, 0.7, 0.7, 0.55, 0.55]
    rng = np.random.default_rng(0)
    ts = np.sort(rng.integers(0, 1000, 300))
    rows = np.sort(rng.integers(0, 1000, 200))
    v = rng.random(300)
    base = asof(rows, ts, v)
    for r, b in zip(rows, base):  # slow reference: the last value stamped at or before the row
        prior = np.flatnonzero(ts <= r)
        assert (np.isnan(b) and prior.size == 0) or b == v[prior[-1]]
    cut = 500  # values stamped after a row's time cannot change it
    v2 = np.where(ts > cut, -1.0, v)
    assert np.array_equal(asof(rows, ts, v2)[rows <= cut], base[rows <= cut], equal_nan=True)


def test_oracle_on_a_generated_cache_knows_the_drift(tmp_path):
    """Two generated quiet sessions with their sidecars: planted_rows joins p_up as of each row's
    ts_recv and p_up ranks the next mid move (AUC > 0.55); planted_drift_rows gives every row
    its own event's drift_K at K = the stride, which predicts the mid's change over the next K
    rows (positive slope), and the oracle trading on it earns at zero cost (no fee, no spread:
    a zero-spread copy of the market, the mid fill); a sidecar written before the drift columns
    leaves the oracle out with one line saying why."""
    import datetime

    from alphafeat import synth
    from alphafeat.precompute import PrecomputeConfig, precompute
    from alphafeat.synth.planted import asof_events, planted_path, read_drift, read_planted, write_planted
    from alphamodel.backtest.market import column, planted_drift_rows, planted_rows
    from alphamodel.data.cache import CacheData

    day = datetime.date(2024, 1, 9)
    synth.generate(tmp_path / "dbn", start=day, sessions=2, seed=2, report=False, signal_file=True, jobs=2)
    precompute(PrecomputeConfig(inputs=[tmp_path / "dbn"], out=tmp_path / "cache", device="cpu"))
    data = CacheData.open(tmp_path / "cache")
    p, note = planted_rows(data)
    assert "for 2 of 2 segments" in note and np.isfinite(p).mean() > 0.99  # NaN only before the first event
    seg = data.segments[0]
    side = planted_path(tmp_path / "dbn", seg.session)
    ts, pu, meta = read_planted(side)
    for i in np.linspace(0, seg.n - 1, 50).astype(int):
        j = np.flatnonzero(ts <= seg.ts[i])
        assert p[i] == pu[j[-1]] if j.size else np.isnan(p[i])
    drift, k, note = planted_drift_rows(data, 10)
    assert k == 10 and "K = 10 rows = the stride" in note and "for 2 of 2 segments" in note
    assert planted_drift_rows(data, 120)[1] == 100  # the stored horizon nearest the stride
    _, dr = read_drift(side)
    j = asof_events(seg.ts, ts)
    assert np.array_equal(drift[:seg.n][j >= 0], dr[10][j[j >= 0]]) and np.all(ts[j[j >= 0]] <= seg.ts[j >= 0])
    mids = [(column(data, k, "bid_px_00") + column(data, k, "ask_px_00")) / 2 for k in range(len(data.segments))]
    market = market_from_arrays(mids, mids, data.tick, 12.5, "cpu")  # zero spread: no crossing cost
    mid, end = market.mid.numpy(), market.end.numpy()
    rows = np.flatnonzero(np.isfinite(drift) & (np.arange(len(mid)) + 10 <= end))
    y = mid[rows + 10] - mid[rows]
    assert np.polyfit(drift[rows], y, 1)[0] > 0.3  # slope 1 in expectation (tests/test_synth_drift.py)
    n = len(data.segments)
    direction = torch.as_tensor(np.sign(np.nan_to_num(drift)), dtype=torch.float32)
    env = VecEnv(market, n, 10)
    env.reset(torch.ones(n, dtype=torch.bool), market.seg_start.clone(), torch.zeros(n))
    rewards, fin = [], torch.zeros(n, dtype=torch.bool)
    while not fin.all():
        r, done = env.step(torch.where(fin, 0.0, direction[env.t]))
        rewards.append(r[~fin])
        fin |= done
    assert float(torch.cat(rewards).mean()) > 0
    moves = np.flatnonzero(np.diff(mid) != 0)  # the mid moves between rows m and m + 1
    moves = moves[np.isfinite(p[moves]) & np.isfinite(mid[moves + 1]) & (end[moves] > moves)]
    from sklearn.metrics import roc_auc_score

    up = mid[moves + 1] > mid[moves]
    assert roc_auc_score(up, p[moves]) > 0.55  # p_up known at row m
    write_planted(side, ts, pu, meta)  # as an older alphafeat wrote it: no drift_K
    drift, k, note = planted_drift_rows(data, 10)
    assert k == 10 and "1 sidecar(s) without drift_K" in note and "--signal-file" in note
    assert np.isnan(drift[:seg.n]).all() and np.isfinite(drift[seg.n:]).any()


def test_oracle_psr_on_a_planted_signal_market():
    """The oracle trading on the true model's expected change over its holding period makes money
    on a planted-signal market in ``mid`` mode at zero fee: PSR >= 0.95 over the test sessions
    (issue 39's must-show). The market quotes one tick wide around the generator's mid, so the
    same oracle in ``taker`` mode pays the spread the ``mid`` mode does not. Six generated
    sessions (the leader's mid per event = one cache row per event; no DBN written), stride 50."""
    import datetime

    from joblib import Parallel, delayed

    from alphafeat import synth
    from alphafeat.synth import simulator as sim
    from alphafeat.synth.planted import DRIFT_HORIZONS, DRIFT_PATHS
    from alphamodel.backtest.config import BacktestConfig
    from alphamodel.backtest.strategies import evaluate, rule

    stride = 50
    mids, drifts = [], []
    args = (5, 0.3, None, 0, None, False, synth.Signal(), DRIFT_HORIZONS, DRIFT_PATHS)
    days = [datetime.date(2024, 1, d) for d in (9, 10, 11, 12, 15, 16)]
    for sess in Parallel(n_jobs=2)(delayed(sim.simulate_session)(day, *args) for day in days):  # 2 cores
        run = sess.runs[sess.leader]
        mids.append(run.mid * 0.25)
        drifts.append(run.drift[:, DRIFT_HORIZONS.index(stride)])
    bids, asks = [m - 0.125 for m in mids], [m + 0.125 for m in mids]  # one tick wide
    market = market_from_arrays(bids, asks, 0.25, 12.5, "cpu")
    z = np.zeros(market.mid.numel())
    market.book = book_from_arrays(np.concatenate(bids) / 0.25, np.concatenate(asks) / 0.25, z, z, z, z,
                                   np.arange(z.size), market.end)
    drift = torch.as_tensor(np.concatenate(drifts), dtype=torch.float32)
    cfg = BacktestConfig(stride=stride, fills=("mid", "taker"))
    strategies = {"oracle": rule(torch.sign(drift)), "flat": rule(torch.zeros_like(drift))}
    ev = {m: evaluate(strategies, market, np.arange(len(mids)), (0.0,), cfg, m) for m in cfg.fills}
    daily = ev["mid"][("oracle", 0.0)]["daily"]
    st = sharpe_stats(daily)
    assert st["psr"] >= 0.95, (daily, st)
    assert np.all(ev["mid"][("flat", 0.0)]["daily"] == 0)
    taker = ev["taker"][("oracle", 0.0)]
    assert taker["daily"].sum() < daily.sum() and taker["entries"].sum() > 0  # taker pays the spread mid does not


def test_encoders_in_worker_processes_and_modes_in_threads_equal_the_runs_in_turn(tmp_path):
    """encoder_jobs = 2: every fold's encoder trains in a spawned process while the first folds'
    policies train; mode_threads = 3 (a GPU's default, here on a CPU): a fold's fill modes train
    and are evaluated in threads, each with its own generator. Every result equals the run that
    does all of it in turn."""
    from alphamodel.backtest import BacktestConfig, backtest

    cache = _hand_cache(tmp_path / "c", sessions=4)
    base = dict(folds=2, stride=50, policy_steps=3, envs=8, costs=(0.0,), device="cpu", encoder_epochs=1,
                encoder_steps=2, plots=False, c51={"batch_size": 16, "hidden": 16}, fills="taker,mid,passive")
    runs = {j: backtest(cache, tmp_path / f"o{j}", None, BacktestConfig.from_dict({**base, "encoder_jobs": j,
                                                                                   "mode_threads": 3 if j > 1 else 1}),
                        progress=False) for j in (1, 2)}
    assert [f["fold"] for f in runs[2]["folds"]] == [0, 1]
    assert len(runs[1]["results"]) == len(runs[2]["results"]) > 0
    for a, b in zip(runs[1]["results"], runs[2]["results"]):
        assert (a["strategy"], a["fold"], a["fill"]) == (b["strategy"], b["fold"], b["fill"])
        assert a["pnl_ticks"] == pytest.approx(b["pnl_ticks"], abs=1e-9), a["strategy"]
        assert a["turnover"] == b["turnover"]
    assert runs[1]["folds"][1]["policy_loss_last_by_fill"] == runs[2]["folds"][1]["policy_loss_last_by_fill"]
    for k in range(2):
        assert (tmp_path / "o2" / f"encoder_fold{k}").is_dir()
        assert (tmp_path / "o2" / f"policy_fold{k}_passive.safetensors").is_file()
