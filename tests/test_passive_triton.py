"""The passive step as one Triton kernel (alphamodel.ops.triton.passive_triton) against the torch
path of alphamodel.backtest.execution (itself held to a slow plain-Python reference in
test_execution.py): every state field, the rewards and the done flags, step after step with
resets, for every queue model, both timeout modes, latencies, fees; the hand-worked queue cases;
and the kernel against the slow reference directly.

Without CUDA the kernel runs in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1`` set
when this module is collected, before triton is imported), where it is the torch path bit for
bit; with CUDA the compiled kernel is compared with the torch path on the GPU, to float32
rounding (the compiler may fuse a multiply and an add). Skipped when triton is not installed.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from execution_reference import random_market, slow_passive

CUDA = torch.cuda.is_available()
if not CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import (see the module docstring)

pytest.importorskip("triton", reason="triton is not installed (pip install triton; CUDA builds of torch bring it)")

from alphamodel.backtest.execution import ExecEnv, FillModel, book_from_arrays  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")
# the interpreter computes both sides of every tl.where (as torch does): NaN / inf where unselected
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")


@pytest.fixture(scope="module", autouse=True)
def kernels():
    from alphamodel.ops.triton import passive_triton

    if not CUDA and not passive_triton.interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set (no GPU to compile for)")
    return passive_triton


def _book(m):
    return book_from_arrays(*(m[k] for k in ("bid", "ask", "bid_sz", "ask_sz", "vol_bid", "vol_ask", "ts", "end")),
                            device=DEVICE)


def _same(a: torch.Tensor, b: torch.Tensor, what: str, exact: bool = True) -> None:
    """Equal bit for bit; to float32 rounding on CUDA (FMA) or where ``exact`` is False."""
    if (CUDA or not exact) and a.is_floating_point():
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-3, msg=what)
    else:
        assert torch.equal(a, b), (what, a, b)


def _pair(b, n, stride, fm=0.05, ft=0.2, **kw):
    """The torch path and the kernel on the same book, fill model and fees."""
    envs = [ExecEnv(b, n, stride, FillModel("passive", **kw), kernel=k) for k in (False, True)]
    assert not envs[0]._kernel and envs[1]._kernel
    for e in envs:
        e.state.reset(torch.ones(n, dtype=torch.bool, device=DEVICE), torch.zeros(n, dtype=torch.long, device=DEVICE),
                      torch.full((n,), fm, device=DEVICE), torch.full((n,), ft, device=DEVICE))
    return envs


def _step_both(envs, q, exact=True):
    (r0, d0), (r1, d1) = (e.step(q) for e in envs)
    _same(r0, r1, "reward", exact)
    assert torch.equal(d0, d1)
    for f, x in envs[0].state.as_dict().items():
        _same(x, getattr(envs[1].state, f), f, exact)
    return d0


@pytest.mark.parametrize("queue,lat,timeout,on_timeout,seed", [
    ("riskaverse", 0, 12, "cancel", 1), ("power:2", 2_000_000, 5, "cross", 2), ("log", 5_000_000, 12, "cross", 3),
    ("through", 0, 6, "cancel", 4), ("power:0.7", 1, 40, "cancel", 5), ("power:3", 9_000_000, 4, "cross", 6)])
def test_kernel_equals_the_torch_path_step_by_step(queue, lat, timeout, on_timeout, seed):
    rng = np.random.default_rng(seed)
    m = random_market(rng, 600, segs=3)
    b = _book(m)
    n, stride, steps = 32, 11, 14
    ok = torch.as_tensor(np.flatnonzero(np.arange(600) < m["end"] - 1), device=DEVICE)
    envs = _pair(b, n, stride, queue=queue, latency_ns=lat, timeout=timeout, on_timeout=on_timeout)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = ok[torch.randint(0, ok.numel(), (n,), generator=g, device=DEVICE)]
    for e in envs:
        e.reset(torch.ones(n, dtype=torch.bool, device=DEVICE), rows)
    levels = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 0.5], device=DEVICE)
    for _ in range(steps):
        q = levels[torch.randint(0, 6, (n,), generator=g, device=DEVICE)]
        # x**N for a fractional N is exp2(N log2 x) in the kernel, torch's pow in the torch path
        done = _step_both(envs, q, exact=queue != "power:0.7")
        if done.any():
            rows = ok[torch.randint(0, ok.numel(), (n,), generator=g, device=DEVICE)]
            for e in envs:
                e.reset(done, rows)
    s = envs[1].state
    assert float(s.qty_maker.sum()) > 0 and float(s.n_orders.sum()) > 0  # the case exercised fills
    if on_timeout == "cross":
        assert float(s.qty_taker.sum()) > 0


def _hand(rows):
    a = np.array(rows, dtype=float)
    T = len(a)
    return {"bid": a[:, 0], "ask": a[:, 1], "bid_sz": a[:, 2], "ask_sz": a[:, 3], "vol_bid": a[:, 4],
            "vol_ask": a[:, 5], "ts": np.arange(T, dtype=np.int64) * 1_000_000, "end": np.full(T, T - 1)}


HAND = {
    "partial then far side": ([(100, 101, 5, 5, 0, 0), (100, 101, 10, 5, 0, 0), (100, 101, 4, 5, 6, 0),
                               (100, 101, 1, 5, 5, 0), (99, 100, 3, 2, 0, 0), (99, 100, 3, 2, 0, 0)], 3),
    "queue 10 ahead, 10 behind, 6 cancelled": ([(100, 101, 5, 5, 0, 0), (100, 101, 10, 5, 0, 0),
                                                (100, 101, 20, 5, 0, 0), (100, 101, 14, 5, 0, 0),
                                                (100, 101, 14, 5, 0, 8), (100, 101, 6, 5, 8, 0),
                                                (100, 101, 6, 5, 0, 0)], 1),
    "timeout": ([(100, 101, 5, 5, 0, 0), (100, 101, 10, 5, 0, 0), (100, 101, 10, 5, 0, 0), (100, 102, 10, 5, 0, 0),
                 (100, 103, 10, 5, 0, 0), (100, 103, 10, 5, 0, 0)], 1),
    "post-only rejected": ([(100, 101, 5, 5, 0, 0), (101, 102, 5, 5, 0, 0), (101, 102, 5, 5, 0, 0)], -1),
    "level away, then back": ([(100, 101, 5, 5, 0, 0), (101, 102, 5, 5, 0, 0), (101, 102, 1, 5, 50, 0),
                               (100, 101, 7, 5, 0, 0), (100, 101, 2, 5, 9, 0)], 1),
}


@pytest.mark.parametrize("case", list(HAND))
@pytest.mark.parametrize("queue,on_timeout", [("riskaverse", "cancel"), ("power:2", "cross"), ("log", "cancel"),
                                              ("through", "cross")])
def test_kernel_equals_the_torch_path_on_the_hand_cases(case, queue, on_timeout):
    rows, target = HAND[case]
    m = _hand(rows)
    envs = _pair(_book(m), 1, len(rows) - 1, fm=0.1, ft=0.3, queue=queue, timeout=3, on_timeout=on_timeout)
    _step_both(envs, torch.tensor([float(target)], device=DEVICE))


def test_kernel_hand_queue_case_power_fills_riskaverse_waits():
    """Queue ahead 10, behind 10, the level drops by 6 with no trade: power:2 -> 7 ahead, so 8
    sold at our price fill 1 of ours; riskaverse keeps 10 ahead (2 left after the trade)."""
    rows, _ = HAND["queue 10 ahead, 10 behind, 6 cancelled"]
    b = _book(_hand(rows))
    for queue, filled, ahead in (("power:2", 1.0, 0.0), ("riskaverse", 0.0, 2.0)):
        e = ExecEnv(b, 1, 6, FillModel("passive", queue=queue), kernel=True)
        e.step(torch.tensor([1.0], device=DEVICE))
        assert float(e.state.qty_maker[0]) == filled and float(e.state.ttf_rows[0]) == 5 * filled
        if not filled:
            assert float(e.state.o_ahead[0]) == ahead


@pytest.mark.parametrize("queue,lat,timeout,on_timeout", [("power:2", 2_000_000, 8, "cross"),
                                                          ("riskaverse", 0, 30, "cancel")])
def test_kernel_equals_the_slow_reference(queue, lat, timeout, on_timeout):
    rng = np.random.default_rng(17)
    m = random_market(rng, 500, segs=2)
    n, stride, steps = 12, 13, 20
    ok = np.flatnonzero(np.arange(500) < m["end"] - 1)
    rows = rng.choice(ok, n)
    targets = rng.choice([-2.0, -1.0, 0.0, 1.0, 2.0], (steps, n))
    fm, ft = 0.05, 0.2
    env = ExecEnv(_book(m), n, stride, FillModel("passive", queue=queue, latency_ns=lat, timeout=timeout,
                                                 on_timeout=on_timeout), kernel=True)
    env.state.reset(torch.ones(n, dtype=torch.bool, device=DEVICE), torch.as_tensor(rows, device=DEVICE),
                    torch.full((n,), fm, device=DEVICE), torch.full((n,), ft, device=DEVICE))
    rewards, finished = [], torch.zeros(n, dtype=torch.bool, device=DEVICE)
    for k in range(steps):
        r, done = env.step(torch.as_tensor(targets[k], dtype=torch.float32, device=DEVICE))
        rewards.append(torch.where(finished, 0.0, r))
        finished |= done
    rewards = torch.stack(rewards).cpu().numpy()
    s = env.state
    for i in range(n):
        ref = slow_passive(m, int(rows[i]), targets[:, i].tolist(), stride, queue, lat, timeout, on_timeout, fm, ft)
        k = len(ref["rewards"])
        np.testing.assert_allclose(rewards[:k, i], ref["rewards"], atol=2e-3)
        for f in ("turnover", "entries", "closed", "wins", "n_orders", "n_rejected", "n_filled", "n_timeouts",
                  "qty_ordered", "qty_maker", "qty_taker", "ttf_rows", "mk1", "mk10", "mk100"):
            assert float(getattr(s, f)[i]) == pytest.approx(ref[f], abs=2e-3), (f, i)
        assert float(s.ttf_ns[i]) == pytest.approx(ref["ttf_ns"], rel=1e-5)


def test_kernel_is_chosen_on_cuda_only_by_default():
    b = _book(_hand(HAND["timeout"][0]))
    e = ExecEnv(b, 2, 3, FillModel("passive"))
    assert e._kernel == CUDA
    assert not ExecEnv(b, 2, 3, FillModel("taker"), kernel=True)._kernel  # only passive has a kernel
