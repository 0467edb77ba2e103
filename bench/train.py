"""Training throughput of the alphamodel network (Mamba2 -> CfC -> heads), before and after.

Measures optimizer steps (forward + backward + AdamW) of the whole stack on random inputs
already on the device (the model's own speed, not the data loader's): windows/s and tokens/s
(= windows/s * K), and peak GPU memory, side by side in one run. Prints a table and one JSON line.

Modes (``--modes``, comma-separated): ``loop`` / ``loop-compile`` — the CfC as a Python loop
over :class:`CfCCell` (before; ``-compile``: blocks and cell compiled, as on main), ``fused`` /
``fused-compile`` — the chunked CfC scan (after; ``-compile``: blocks and the scan's chunk body
compiled), ``triton`` / ``triton-compile`` — the CfC scan as Triton kernels (CUDA;
:mod:`alphamodel.ops.triton.cfc_triton`; ``-compile``: blocks and the CfC's forward around the kernels
compiled; launch set by ``--cfc-block/--cfc-warps/--cfc-stages``); ``+ssd`` after the CfC's name
(``triton+ssd-compilegraph``): the Mamba2 blocks' SSD scan as Triton kernels too
(``ssd_impl="triton"``, :mod:`alphamodel.ops.triton.ssd_triton`; ``--ssd-warps`` warps per program); ``-graph`` /
``-compilegraph`` (CUDA): one whole step (forward, backward, AdamW) captured in a CUDA graph
and replayed (no per-kernel launch cost), eager or compiled. On CUDA:
bf16 autocast, the SSD scan and CfC state in fp32 with TF32 matmuls.

    python bench/train.py [--device cuda] [--batch 64] [--window 512] [--d-model 128]
                          [--layers 4] [--steps 20] [--modes loop,fused,loop-compile,fused-compile]
                          [--cfc 64] [--cfc-block 16] [--cfc-warps 8] [--cfc-stages 0]
                          [--cache DIR]   (adds the batch loader's tokens/s on that cache)
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from alphamodel.nn.cfc import check_triton
from alphamodel.nn.model import AlphaModel, ModelConfig, masked_bce_loss
from alphamodel.supervised.train import compile_model


def run(mode: str, args: argparse.Namespace, device: torch.device) -> dict:
    torch.manual_seed(0)
    impl, _, how = mode.partition("-")
    impl, _, ssd = impl.partition("+")
    cfg = ModelConfig(n_features=args.features, n_horizons=5, d_model=args.d_model, n_layers=args.layers,
                      d_state=args.d_state, headdim=args.headdim, chunk_size=args.chunk, cfc_hidden=args.cfc,
                      cfc_impl=impl, ssd_impl="triton" if ssd == "ssd" else "chunked")
    model = AlphaModel(cfg).to(device)
    for blk in model.blocks:
        blk.mixer.ssd_warps = args.ssd_warps
    model.cfc.chunk = args.cfc_chunk
    if impl == "triton":
        check_triton(model.cfc.cell, args.cfc_block)
        model.cfc.block_b, model.cfc.num_warps = args.cfc_block, args.cfc_warps
        model.cfc.num_stages = args.cfc_stages or None
    fwd = compile_model(model) if how.startswith("compile") else model
    graph = how.endswith("graph") and device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=graph)
    B, K = args.batch, args.window
    x = torch.randn(B, K, args.features, device=device)
    dt = torch.rand(B, K, device=device) * 0.01
    y = (torch.rand(B, K, 5, device=device) < 0.5).float()
    y[:, :, 4] = float("nan")
    amp = device.type == "cuda"

    def step() -> float:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = fwd(x, dt)
        loss = masked_bce_loss(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    if graph:  # warm up on a side stream, then capture one whole step and replay it
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(args.warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits = fwd(x, dt)
            static_loss = masked_bce_loss(logits, y)
            static_loss.backward()
            opt.step()

        def step() -> torch.Tensor:  # noqa: F811 — the captured step
            g.replay()
            return static_loss

        step()
    else:
        for _ in range(args.warmup):
            step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    float(loss.detach())
    if device.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return {"mode": mode, "windows_per_s": B * args.steps / s, "tokens_per_s": B * K * args.steps / s,
            "step_ms": 1000 * s / args.steps, "warmup_s": warm_s, "peak_gib": peak,
            "parameters": sum(p.numel() for p in model.parameters())}


def loader(args: argparse.Namespace) -> dict:
    """Tokens/s of the training batches gathered from a memory-mapped cache by
    ``--loader-threads`` threads (the trainer's ``loader_threads``): whether loading keeps up."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from alphamodel.data.cache import CacheData
    from alphamodel.supervised.config import TrainConfig
    from alphamodel.supervised.train import Streams

    data = CacheData.open(args.cache)
    rows = np.arange(data.n_rows, dtype=np.int64)
    norm = data.fit_normaliser(rows, max_rows=200_000)
    tc = TrainConfig(window=args.window, batch_size=args.batch)
    streams = Streams(data, rows, tc, np.random.default_rng(0), stateful=True)
    data.batch(streams.next()[0], args.window, norm)
    pool = ThreadPoolExecutor(args.loader_threads)
    queue = [pool.submit(data.batch, streams.next()[0], args.window, norm) for _ in range(args.loader_threads + 1)]
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 5.0:
        b = queue.pop(0).result()
        queue.append(pool.submit(data.batch, streams.next()[0], args.window, norm))
        if args.device == "cuda":
            torch.from_numpy(b.x).pin_memory().to("cuda", non_blocking=True)
        n += 1
    s = time.perf_counter() - t0
    pool.shutdown(cancel_futures=True)
    return {"mode": f"loader x{args.loader_threads}", "windows_per_s": n * args.batch / s,
            "tokens_per_s": n * args.batch * args.window / s,
            "step_ms": 1000 * s / n, "warmup_s": 0.0, "peak_gib": None, "parameters": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--features", type=int, default=28)
    ap.add_argument("--d-model", dest="d_model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-state", dest="d_state", type=int, default=64)
    ap.add_argument("--headdim", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--cfc", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cfc-chunk", dest="cfc_chunk", type=int, default=16, help="steps per fused CfC chunk")
    ap.add_argument("--cfc-block", dest="cfc_block", type=int, default=16, help="triton: batch rows per program")
    ap.add_argument("--cfc-warps", dest="cfc_warps", type=int, default=8, help="triton: warps per program")
    ap.add_argument("--cfc-stages", dest="cfc_stages", type=int, default=0,
                    help="triton: pipeline stages (0: 2 for bf16, 1 for float32)")
    ap.add_argument("--ssd-warps", dest="ssd_warps", type=int, default=4, help="ssd triton: warps per program")
    ap.add_argument("--modes", default="loop,fused,loop-compile,fused-compile")
    ap.add_argument("--cache", help="also time the batch loader on this cache (mode 'loader')")
    ap.add_argument("--loader-threads", dest="loader_threads", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as alphamodel train)")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    rows = [run(m, args, device) for m in args.modes.split(",")]
    if args.cache:
        rows.append(loader(args))
    size = {k: getattr(args, k) for k in ("batch", "window", "features", "d_model", "layers", "d_state",
                                          "headdim", "chunk", "cfc", "cfc_chunk", "cfc_block", "cfc_warps",
                                          "cfc_stages", "ssd_warps")}
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"alphamodel training throughput on {name} (torch {torch.__version__}), size {size}")
    print(f"{'mode':>14} {'windows/s':>11} {'tokens/s':>12} {'step ms':>9} {'warm-up s':>10} {'peak GiB':>9}")
    for r in rows:
        print(f"{r['mode']:>14} {r['windows_per_s']:>11.1f} {r['tokens_per_s']:>12.0f} {r['step_ms']:>9.1f} "
              f"{r['warmup_s']:>10.1f} {r['peak_gib'] or float('nan'):>9.2f}")
    print(json.dumps({"device": name, "torch": torch.__version__, "size": size, "results": rows}))


if __name__ == "__main__":
    main()
