"""Registers, spills and shared memory of the CfC Triton kernels, compiled for a GPU without one.

Compiles :mod:`alphamodel.ops.triton.cfc_triton`'s forward and backward kernels ahead of time for
``--arch`` (default 90, the H100/H200) at the model's sizes, for each launch
``BLOCKxWARPSxSTAGES`` of ``--launches``, and runs the ptxas that ships with Triton (``-v``) on the
PTX for the register and spill counts. A launch whose shared memory exceeds the GPU's (228 KiB
on sm_90) would fail there with OutOfResources. Prints a table and one JSON line.

    python bench/cfc_triton_regs.py [--n 128] [--bb 128] [--dtype bf16]
                                    [--launches 16x4x1,16x8x1,32x8x1,16x8x2] [--arch 90]

Needs triton (not its interpreter: leave TRITON_INTERPRET unset); no GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from alphamodel.ops.triton import cfc_triton

FWD = {"uw_ptr": "*W", "dt_ptr": "*fp32", "keep_ptr": "*u8", "x0_ptr": "*fp32", "wx_ptr": "*W", "wfgh_ptr": "*W",
       "bfgh_ptr": "*W", "it_ptr": "*fp32", "y_ptr": "*fp32", "z_ptr": "*W", "fgh_ptr": "*W", "B": "i32", "T": "i32"}
BWD = {**FWD, "gy_ptr": "*fp32", "da_ptr": "*W", "dfgh_ptr": "*W", "dx0_ptr": "*fp32", "dtau_ptr": "*fp32",
       "ddt_ptr": "*fp32"}


def ptxas() -> Path:
    """The newest ptxas in Triton's wheel (it must read the PTX version Triton writes)."""
    bins = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return next(p for p in (bins / "ptxas-blackwell", bins / "ptxas") if p.exists())


def compile_one(fn, types: dict[str, str], consts: dict, wd: str, arch: int, launch: tuple[int, int, int]) -> dict:
    """Shared memory, registers and spill bytes of ``fn`` compiled for ``sm_{arch}``."""
    block, warps, stages = launch
    consts = {**consts, "BLOCK_B": block}
    sig = {a: "constexpr" if a in consts else types[a].replace("W", wd) for a in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(k.asm["ptx"])
        log = subprocess.run([str(ptxas()), "-v", f"--gpu-name=sm_{arch}a", str(src), "-o", str(Path(d) / "k.o")],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return {"shared_bytes": k.metadata.shared, "registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=128, help="CfC units")
    ap.add_argument("--bb", type=int, default=128, help="backbone width")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--launches", default="16x4x1,16x8x1,32x8x1,16x8x2")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    if cfc_triton.interpreted():
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to compile the kernels")
    consts = {"N": args.n, "BB": args.bb, "PREC": "ieee" if args.dtype == "fp32" else "tf32"}
    rows = []
    for text in args.launches.split(","):
        launch = tuple(int(v) for v in text.split("x"))
        for name, fn, types, extra in (("forward", cfc_triton.fwd_kernel, FWD, {"SAVE": True}),
                                       ("backward", cfc_triton.bwd_kernel, BWD, {"NEED_DDT": False})):
            r = compile_one(fn, types, {**consts, **extra}, args.dtype, args.arch, launch)
            rows.append({"kernel": name, "launch": text, **r})
    print(f"CfC Triton kernels for sm_{args.arch}, n={args.n}, bb={args.bb}, {args.dtype} "
          f"(triton {triton.__version__})")
    print(f"{'kernel':>9} {'launch':>8} {'shared B':>9} {'registers':>10} {'spill B':>8}")
    for r in rows:
        print(f"{r['kernel']:>9} {r['launch']:>8} {r['shared_bytes']:>9} {r['registers'] or 0:>10} "
              f"{r['spill_store_bytes']:>8}")
    print(json.dumps({"arch": args.arch, "n": args.n, "bb": args.bb, "dtype": args.dtype,
                      "triton": triton.__version__, "results": rows}))


if __name__ == "__main__":
    main()
