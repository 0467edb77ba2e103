"""Speed of the backtest environment (alphamodel.backtest.env.VecEnv): env-steps per second.

One env-step = one decision of one environment (trade to a target, hold ``--stride`` rows,
mark to mid, close at a session end). Two paths, N parallel environments each:

* ``env``: :meth:`VecEnv.step` with given targets, plus the reset of finished environments to
  random rows (as in training) — the environment alone;
* ``frozen``: the frozen-encoder policy step of the backtest: gather the precomputed
  embeddings of the N current rows, append position and fee, the C51 network's forward pass
  (51 atoms x 3 actions), greedy action on the means, then the environment step and reset.

The market is a synthetic random walk of ``--sessions`` sessions of ``--rows`` rows (1-tick
spread) already on the device, so the figure is the step itself, not I/O. Timed after
``--warmup`` steps, with ``torch.cuda.synchronize`` around the timed loop on CUDA. Prints a
table and one JSON line.

``--compile`` adds the same two paths with the environment step (and the policy's forward)
through ``torch.compile``
(``env-c``, ``frozen-c``; compile time excluded by the warm-up).

``--fill taker,mid,passive`` times the same paths in
:class:`alphamodel.backtest.execution.ExecEnv` of each fill mode instead (paths ``env:passive``
...; the book's sizes and traded volumes random, ``--queue``, ``--timeout`` as the backtest's). On
CUDA a ``passive`` step is the Triton kernel (:mod:`alphamodel.ops.triton.passive_triton`,
ExecEnv's default there), which ``--compile`` leaves as it is (it compiles the policy's forward).

    python bench/env.py [--device cpu|cuda] [--n 1,64,1024,8192] [--steps 200] [--threads 1] [--compile]
                        [--fill taker,passive] [--queue riskaverse] [--timeout 100]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from alphamodel.backtest.env import VecEnv
from alphamodel.backtest.execution import Book, ExecEnv, FillModel
from alphamodel.backtest.market import market_from_arrays
from alphamodel.rl.c51 import C51Net, greedy, support


def _market(sessions: int, rows: int, device: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    bids = [5000 + 0.25 * np.cumsum(rng.choice([-1, 0, 0, 1], rows)) for _ in range(sessions)]
    return market_from_arrays(bids, [b + 0.25 for b in bids], 0.25, 12.5, device)


def _book(market, seed: int = 1) -> Book:
    """The market's rows with random touch sizes (1..30) and traded volumes (0..10 a side)."""
    g = torch.Generator(device=market.device).manual_seed(seed)
    T, dev = market.mid.numel(), market.device
    size = lambda hi: torch.randint(0, hi, (T,), device=dev, generator=g).float()  # noqa: E731
    ts = torch.cumsum(torch.randint(1, 5_000_000, (T,), device=dev, generator=g), 0)
    return Book(market.mid - market.half_spread, market.mid + market.half_spread, size(30) + 1, size(30) + 1,
                size(10), size(10), ts, market.end, market.mid, market.half_spread)


def _run(path: str, n: int, market, stride: int, steps: int, warmup: int, dim: int, device: str,
         compile: bool = False, fill: FillModel | None = None, book: Book | None = None) -> float:
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    env = VecEnv(market, n, stride, compile=compile) if fill is None else ExecEnv(book, n, stride, fill, compile)
    T = market.mid.numel()
    all_ = torch.ones(n, dtype=torch.bool, device=dev)
    env.reset(all_, torch.randint(0, T - 1, (n,), device=dev, generator=g), torch.rand(n, device=dev, generator=g))
    emb = torch.randn(T, dim, device=dev, generator=g)
    net = C51Net(dim + 2, 3, 51, 128).to(dev).eval()
    z = support(51, -20, 20, dev)
    targets = torch.randint(-1, 2, (16, n), device=dev, generator=g).float()

    def policy(rows: torch.Tensor, pos: torch.Tensor, fee: torch.Tensor) -> torch.Tensor:
        obs = torch.cat([emb[rows], torch.sign(pos)[:, None], fee[:, None]], 1)
        return (greedy(torch.softmax(net(obs)[0], -1), z) - 1).float()

    if compile:
        policy = torch.compile(policy, dynamic=False)

    def one(k: int) -> None:
        if path == "env":
            target = targets[k % 16]
        else:
            target = policy(env.t, env.pos, env.fee)
        _, done = env.step(target)
        env.reset(done, torch.randint(0, T - 1, (n,), device=dev, generator=g))

    with torch.no_grad():
        for k in range(warmup):
            one(k)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for k in range(steps):
            one(k)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return n * steps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n", default="1,64,1024,8192", help="numbers of parallel environments")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--stride", type=int, default=200)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--rows", type=int, default=100_000, help="rows per session")
    ap.add_argument("--dim", type=int, default=64, help="embedding width of the frozen path")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd step (paths env-c, frozen-c)")
    ap.add_argument("--fill", default=None, help="fill modes through ExecEnv (taker,mid,passive); default VecEnv")
    ap.add_argument("--queue", default="riskaverse")
    ap.add_argument("--timeout", type=int, default=100)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    market = _market(a.sessions, a.rows, a.device)
    book = _book(market)
    fills = [None] if a.fill is None else [FillModel(m, a.queue, 0, a.timeout).checked() for m in a.fill.split(",")]
    res = []
    for n in (int(x) for x in a.n.split(",")):
        for fill in fills:
            for path in ("env", "frozen"):
                for comp in ((False, True) if a.compile else (False,)):
                    name = path + ("-c" if comp else "") + ("" if fill is None else f":{fill.mode}")
                    res.append({"path": name, "n": n, "env_steps_per_s": _run(
                        path, n, market, a.stride, a.steps, a.warmup, a.dim, a.device, comp, fill, book)})
    t = Table(title=f"env-steps/s on {a.device} (stride {a.stride}, {torch.get_num_threads()} threads)")
    for c in ("path", "N", "env-steps/s", "rows/s (x stride)"):
        t.add_column(c, justify="right")
    for r in res:
        t.add_row(r["path"], str(r["n"]), f"{r['env_steps_per_s']:,.0f}", f"{r['env_steps_per_s'] * a.stride:,.0f}")
    Console().print(t)
    dev_name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(json.dumps({"bench": "env", "device": dev_name, "threads": torch.get_num_threads(), "stride": a.stride,
                      "steps": a.steps, "dim": a.dim, "results": res}))


if __name__ == "__main__":
    main()
