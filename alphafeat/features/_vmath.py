"""Branch-free float64 ``exp``, ``expm1``, ``log`` and ``log1p`` that LLVM can vectorise.

numba's libm calls (``math.exp`` ...) are opaque calls, so a loop containing one stays
scalar (the pip llvmlite has no SVML). These are plain arithmetic on float64 and on the
int64 bit pattern (two bit-cast intrinsics), with selects instead of branches, meant to be
inlined (``inline="always"``) into loops over a block of rows.

Methods (Muller, *Elementary Functions*, 3rd ed., ch. 11: additive range reduction):

* ``exp`` / ``expm1``: ``x = k ln2 + r``, ``|r| <= ln2/2``, ``k`` rounded with the
  ``1.5 * 2**52`` shifter; ``r`` in two parts with the Cody–Waite split ``ln2 = ln2_hi +
  ln2_lo`` (fdlibm's constants, ``k ln2_hi`` exact) plus the rounding error of ``r``;
  ``expm1(r) = r + r^2 q(r)`` with the Taylor polynomial of degree 13 (truncation below
  ``1e-17`` relative on ``|r| <= ln2/2``); ``exp(x) = 2^k (1 + expm1(r))`` (``2^k`` built in
  two factors from the exponent bits, so results that underflow into subnormals are rounded
  once), ``expm1(x) = 2^k r + (2^k - 1) + 2^k w`` (``w = r^2/2 + r^3 q(r) + c``).
* ``log`` / ``log1p`` (fdlibm ``e_log.c`` / ``s_log1p.c``, Sun Microsystems 1993):
  ``u = 2^k m``, ``m`` in ``[sqrt(2)/2, sqrt(2))``, ``f = m - 1``, ``s = f / (2 + f)``,
  ``log(1 + f) = f - (f^2/2 - s (f^2/2 + R(s^2)))`` with fdlibm's minimax ``Lg1..Lg7``;
  ``log1p`` takes ``u = 1 + x`` and adds fdlibm's correction ``c = (x - (u - 1)) / u``
  (``(1 - (u - x)) / u`` for ``u >= 2``), the rounding error of ``u``.

Accuracy (tests/test_fastmath.py): at most 1 ulp from libm (glibc, through numpy) on every
value tested over the whole float64 range, subnormal arguments and results included; under
1 ulp from the exact value (mpmath, 120 bits) where ours and libm differ (worst seen: 0.98
ulp, ``expm1``; 0.76-0.77 for the others). Special values as C99 (NaN -> NaN,
``exp(-inf) = 0``, ``exp(+inf) = inf``, ``expm1(-inf) = -1``, ``log(0) = -inf``,
``log(x < 0) = NaN``, ``log1p(-1) = -inf``, ``log1p(x < -1) = NaN``, ``expm1(-0.0) =
log1p(-0.0) = -0.0``).

Fused multiply-adds (``llvm.fma.f64``, exact by definition) shorten the dependency chains;
on a CPU without FMA LLVM calls libm's ``fma`` instead (same values, slower).
"""

from __future__ import annotations

import math

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def f2i(typingctx, x):
    """The bits of a float64 as an int64 (LLVM ``bitcast``; vectorises)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def i2f(typingctx, x):
    """The float64 with the bits of an int64 (LLVM ``bitcast``; vectorises)."""
    if x != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM ``llvm.fma.f64``: one instruction where the CPU has FMA)."""
    if not (a == types.float64 and b == types.float64 and c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


_INV_LN2 = 1.44269504088896338700e00
_LN2_HI = 6.93147180369123816490e-01  # 0x3fe62e42fee00000: k * _LN2_HI exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10  # 0x3dea39ef35793c76
_SHIFT = 6755399441055744.0  # 1.5 * 2**52: x + _SHIFT rounds x to an integer in the low bits
_SHIFT_BITS = 0x4338000000000000
_EXP_CLAMP = 800.0  # |x| beyond it: exp is 0 or inf either way (k stays within 2 * 577)
_EXPM1_OVF = 709.782712893383973096  # log(DBL_MAX): above, expm1 = inf
_INF = math.inf
_NAN = math.nan

# Taylor coefficients 1/n!, n = 3 .. 13 (1/2! enters as the exact 0.5 in _exp_reduce)
_C3 = 1.0 / 6.0
_C4 = 1.0 / 24.0
_C5 = 1.0 / 120.0
_C6 = 1.0 / 720.0
_C7 = 1.0 / 5040.0
_C8 = 1.0 / 40320.0
_C9 = 1.0 / 362880.0
_C10 = 1.0 / 3628800.0
_C11 = 1.0 / 39916800.0
_C12 = 1.0 / 479001600.0
_C13 = 1.0 / 6227020800.0

# fdlibm e_log.c minimax coefficients of (log(1+f) - 2s) / (2s) ~ R(s^2)
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_TWO54 = 18014398509481984.0
_MIN_NORMAL = 2.2250738585072014e-308
_SQRTH_BITS = 0x3FE6A09E00000000  # just below sqrt(2)/2: m = u / 2^k lies in [this, 2 * this)
_ONE_BITS = 0x3FF0000000000000
_TWO52_BITS = 0x4330000000000000  # 2**52: its low mantissa bits hold a small integer


@numba.njit(cache=True, inline="always")
def _exp_reduce(x):
    """``(k, r, w)``: ``x = k ln2 + r + c`` (``x`` clamped to +-800, NaN kept; ``k`` int64,
    ``c`` the rounding error of ``r``), ``expm1(r + c) ~ r + w``, ``w = r^2/2 + r^3 q(r) + c``."""
    xc = -_EXP_CLAMP if x < -_EXP_CLAMP else x
    xc = _EXP_CLAMP if xc > _EXP_CLAMP else xc
    t = fma(xc, _INV_LN2, _SHIFT)
    kf = t - _SHIFT
    k = f2i(t) - _SHIFT_BITS
    hi = fma(-kf, _LN2_HI, xc)  # exact
    lo = kf * _LN2_LO
    r = hi - lo
    c = (hi - r) - lo
    r2 = r * r
    r2lo = fma(r, r, -r2)  # r^2 = r2 + r2lo exactly
    r4 = r2 * r2
    # q(r) = sum_{n=3..13} r^(n-3) / n!, Estrin's scheme (a short dependency chain)
    q0 = fma(r2, fma(r, _C6, _C5), fma(r, _C4, _C3))
    q1 = fma(r2, fma(r, _C10, _C9), fma(r, _C8, _C7))
    q2 = fma(r2, _C13, fma(r, _C12, _C11))
    q = fma(r4 * r4, q2, fma(r4, q1, q0))
    # w = r^2 / 2 + r^3 q(r) + c: the leading term exact, the rest small
    return k, r, fma(0.5, r2, fma(r2 * r, q, fma(0.5, r2lo, c)))


@numba.njit(cache=True, inline="always")
def _exp_from(k, r, w):
    k1 = k >> 1
    k2 = k - k1
    s1 = i2f((k1 + 1023) << 52)
    s2 = i2f((k2 + 1023) << 52)
    return ((1.0 + (r + w)) * s1) * s2


@numba.njit(cache=True, inline="always")
def _expm1_from(x, k, r, w):
    kk = -61 if k < -61 else k  # below, expm1 = -1 (the select after)
    big = kk > 1023  # 2^1024 overflows: 2 (2^1023 (1 + r + w) - 1/2)
    s = i2f(((1023 if big else kk) + 1023) << 52)
    y = fma(s, w, fma(s, r, s - (0.5 if big else 1.0)))
    y = 2.0 * y if big else y
    y = -1.0 if x < -40.0 else y
    y = x if x == 0.0 else y  # -0.0 kept
    return _INF if x > _EXPM1_OVF else y


@numba.njit(cache=True, inline="always")
def vexp(x):
    """``exp(x)``, branch-free (see the module docstring)."""
    k, r, w = _exp_reduce(x)
    return _exp_from(k, r, w)


@numba.njit(cache=True, inline="always")
def vexpm1(x):
    """``expm1(x)``, branch-free (see the module docstring)."""
    k, r, w = _exp_reduce(x)
    return _expm1_from(x, k, r, w)


@numba.njit(cache=True, inline="always")
def vexp_expm1(x):
    """``(exp(x), expm1(x))`` from one range reduction (the same values as :func:`vexp` and
    :func:`vexpm1`)."""
    k, r, w = _exp_reduce(x)
    return _exp_from(k, r, w), _expm1_from(x, k, r, w)


@numba.njit(cache=True, inline="always")
def _log_core(u, c, koff):
    """``log(u 2^-koff) + c`` for a positive normal finite ``u`` (``c`` a tiny correction)."""
    b = f2i(u)
    e = (b + (_ONE_BITS - _SQRTH_BITS)) & 0x7FF0000000000000  # biased exponent k + 1023, in place
    m = i2f((b - e) + _ONE_BITS)  # u / 2^k, in [sqrt(2)/2, sqrt(2))
    kf = (i2f(_TWO52_BITS | (e >> 52)) - (4503599627370496.0 + 1023.0)) - koff  # k as float64 (no int conversion)
    f = m - 1.0
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * fma(w, fma(w, _LG6, _LG4), _LG2)
    t2 = z * fma(w, fma(w, fma(w, _LG7, _LG5), _LG3), _LG1)
    R = t2 + t1
    return kf * _LN2_HI - ((hfsq - (s * (hfsq + R) + (kf * _LN2_LO + c))) - f)


@numba.njit(cache=True, inline="always")
def vlog(x):
    """``log(x)``, branch-free (see the module docstring)."""
    sub = x < _MIN_NORMAL
    u = x * _TWO54 if sub else x
    u = 1.0 if not ((u > 0.0) & (u < _INF)) else u  # specials: any valid argument, replaced below
    y = _log_core(u, 0.0, 54.0 if sub else 0.0)
    sp = -_INF if x == 0.0 else (x if x > 0.0 else _NAN)  # 0, +inf; negative or NaN
    return y if ((x > 0.0) & (x < _INF)) else sp


@numba.njit(cache=True, inline="always")
def vlog1p(x):
    """``log1p(x)``, branch-free (see the module docstring)."""
    u = 1.0 + x
    ok = (u > 0.0) & (u < _INF)
    uu = u if ok else 1.0  # never 0: no division by zero under any error model
    c = ((1.0 - (uu - x)) if uu >= 2.0 else (x - (uu - 1.0))) / uu
    y = _log_core(uu, c if ok else 0.0, 0.0)
    sp = -_INF if u == 0.0 else (u if u > 0.0 else _NAN)  # -1, +inf; < -1 or NaN
    y = y if ok else sp
    return x if x == 0.0 else y  # +-0 kept
