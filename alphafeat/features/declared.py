"""Row kernels of the declared features (:func:`alphafeat.features.registry.register`), generated
from their declarations.

Each declared feature gives a scalar ``row`` function and the names of its inputs; the plan
(:func:`alphafeat.features.registry.make_plan`) resolves each name to a source expression
(``bid_px[i, 0]``, ``out[0, i]``, ...). This module writes one loop over the rows calling every
declared ``row`` function and compiles it: with ``numba.njit`` for the CPU (a function of
:class:`alphafeat.features.cpu_kernels.Inputs`, the result matrix and a row range) and as a
``numba.cuda.jit`` kernel (grid-stride loop over the rows) for the GPU. The compiled kernel is
kept on the plan (``plan.derived``), so it is built once per plan and process.

The registry's ``cpu`` and ``cuda`` strings of a declared feature name this module by its former
name, ``alphafeat.features._declared``: caches store those strings with their columns
(``column_specs``), and a changed string would make every existing cache stale.
"""

from __future__ import annotations

from collections.abc import Callable

from alphafeat.errors import UsageError
from alphafeat.features.registry import Plan

_CPU_SOURCE = """
def declared_rows(inp, out, lo, hi):
    bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt = inp
    for i in range(lo, hi):
{body}
"""

_CUDA_SOURCE = """
def declared_rows(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, out, lo, hi):
    for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
{body}
"""


def _source(plan: Plan, template: str) -> str:
    calls = (f"        out[{col}, i] = f{k}({', '.join(args)})" for k, (_, col, args) in enumerate(plan.declared))
    body = "\n".join(calls)
    return template.format(body=body)


def row_kernel(plan: Plan, target: str) -> Callable | None:
    """The compiled row kernel of ``plan``'s declared features for ``target`` (``'cpu'`` or
    ``'cuda'``), or None when the plan declares none.

    CPU: ``kernel(inputs, out, lo, hi)`` fills the declared columns of ``out`` for rows
    ``[lo, hi)`` (releases the GIL). CUDA: ``kernel[grid](bid_px, ask_px, bid_sz, ask_sz, ts,
    buy, sell, cnt, out, lo, hi)`` on device arrays. Row i reads rows i and i - 1 only.
    """
    if not plan.declared:
        return None
    key = f"declared_rows/{target}"
    got = plan.derived.get(key)
    if got is not None:
        return got
    ns: dict = {}
    if target == "cpu":
        import numba

        for k, (fn, _, _) in enumerate(plan.declared):
            ns[f"f{k}"] = numba.njit(inline="always")(fn)
        exec(compile(_source(plan, _CPU_SOURCE), f"<declared rows of {len(plan.declared)} features>", "exec"), ns)
        got = numba.njit(nogil=True)(ns["declared_rows"])
    elif target == "cuda":
        from numba import cuda

        ns["cuda"] = cuda
        for k, (fn, _, _) in enumerate(plan.declared):
            ns[f"f{k}"] = cuda.jit(device=True)(fn)
        exec(compile(_source(plan, _CUDA_SOURCE), f"<declared rows of {len(plan.declared)} features>", "exec"), ns)
        got = cuda.jit(ns["declared_rows"])
    else:
        raise UsageError("target", "expected 'cpu' or 'cuda'", target)
    plan.derived[key] = got
    return got
