"""The CfC scan alone, forward + backward: the fused chunked scan vs the Triton kernels.

Times :class:`alphamodel.nn.cfc.CfC` (input (B, T, d_in), states (B, T, n)) for each mode side by
side in one run, under bf16 autocast on CUDA (float32 on CPU), and checks each mode's states and
input gradient against the first mode's (largest difference relative to the largest value).
Prints a table and one JSON line.

Modes (``--modes``, comma-separated): ``fused`` / ``fused-compile`` (the chunk body compiled),
``loop``, and ``triton`` or ``triton:BLOCKxWARPSxSTAGES`` (launch: batch rows per program,
warps, pipeline stages, 0 = 2 for bf16 and 1 for float32; default 16x8x0). A mode that fails
(a launch that exceeds the GPU's shared memory) is reported with its error and the run goes on.

    python bench/cfc_scan.py [--device cuda] [--batch 2048] [--window 512] [--d-in 128] [--cfc 128]
                             [--steps 10] [--modes fused-compile,triton,triton:16x8x1,triton:16x4x2,triton:32x8x2]

On CPU the Triton modes need ``TRITON_INTERPRET=1`` (a correctness run, not a speed figure).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from alphamodel.nn.cfc import CfC


def make(mode: str, args: argparse.Namespace, device: torch.device) -> CfC:
    """The CfC of ``mode`` with seed-0 weights (the same for every mode)."""
    impl, _, launch = mode.partition(":")
    impl, _, how = impl.partition("-")
    block, warps, stages = (int(v) for v in (launch or "16x8x0").split("x"))
    torch.manual_seed(0)
    net = CfC(args.d_in, args.cfc, impl=impl, block_b=block, num_warps=warps, num_stages=stages or None).to(device)
    if how == "compile":
        net.compile_scan()
    return net


def step(net: CfC, u: torch.Tensor, dt: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward + backward; returns the states and the input's gradient."""
    u.grad = None
    with torch.autocast(u.device.type, dtype=torch.bfloat16, enabled=u.is_cuda):
        y = net(u, dt)
    (y.float() * w).sum().backward()
    return y.detach(), u.grad


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(mode: str, args: argparse.Namespace, device: torch.device, inputs: tuple, ref: tuple | None) -> dict:
    """Seconds per forward + backward of ``mode`` and its difference from ``ref``."""
    row = {"mode": mode}
    try:
        net = make(mode, args, device)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            out = step(net, *inputs)
        sync(device)
        row["warmup_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(args.steps):
            out = step(net, *inputs)
        sync(device)
        s = (time.perf_counter() - t0) / args.steps
    except Exception as e:  # a launch the GPU cannot take: report it, go on with the next mode
        return {**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    tokens = args.batch * args.window
    row.update(step_ms=1000 * s, tokens_per_s=tokens / s, outputs=out)
    if ref is not None:
        row["rel_diff_states"], row["rel_diff_du"] = (
            float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(out, ref))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--d-in", dest="d_in", type=int, default=128)
    ap.add_argument("--cfc", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default="fused-compile,triton,triton:16x8x1,triton:16x4x2,triton:32x8x2")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch sees no CUDA device")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    g = torch.Generator().manual_seed(1)
    u = torch.randn(args.batch, args.window, args.d_in, generator=g).to(device).requires_grad_()
    dt = (torch.rand(args.batch, args.window, generator=g) * 0.01).to(device)
    w = torch.randn(args.batch, args.window, args.cfc, generator=g).to(device)
    rows, ref = [], None
    for mode in args.modes.split(","):
        rows.append(run(mode, args, device, (u, dt, w), ref))
        ref = ref if ref is not None or "error" in rows[-1] else rows[-1]["outputs"]
    for r in rows:
        r.pop("outputs", None)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    size = {k: getattr(args, k) for k in ("batch", "window", "d_in", "cfc")}
    print(f"CfC scan forward + backward on {name} (torch {torch.__version__}), size {size}")
    print(f"{'mode':>18} {'step ms':>9} {'tokens/s':>12} {'rel diff y':>11} {'rel diff du':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:>18} {r['error']}")
            continue
        print(f"{r['mode']:>18} {r['step_ms']:>9.2f} {r['tokens_per_s']:>12.0f} "
              f"{r.get('rel_diff_states', 0.0):>11.2e} {r.get('rel_diff_du', 0.0):>12.2e}")
    print(json.dumps({"device": name, "torch": torch.__version__, "size": size, "results": rows}))


if __name__ == "__main__":
    main()
