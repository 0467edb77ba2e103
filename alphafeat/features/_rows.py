"""Per-row feature code, one source compiled for two targets.

This file is loaded twice by :func:`alphafeat.features.twin.load`: as
``alphafeat.features._rows_cpu`` (every function ``numba.njit``) and as
``alphafeat.features._rows_cuda`` (every function ``numba.cuda.jit(device=True)``). The CPU
drivers (:mod:`alphafeat.features.cpu`) and the CUDA kernels (:mod:`alphafeat.cuda.kernels`)
call the same formulas, so the two paths differ only by libm vs libdevice rounding and by
the association of the chunked scans.

Column indices come from the layout vector ``L`` and the plan arrays of
:func:`alphafeat.features.registry.make_plan` (the integer constants below mirror it).
"""

import math

if __name__.endswith("_cuda"):
    from numba import cuda

    jit = cuda.jit(device=True, cache=True)
else:
    import numba

    jit = numba.njit(cache=True, nogil=True)

# layout entries (registry.L_*)
L_OFI = 0
L_SV = 1
L_LOGDT = 2
L_RET = 3
L_OFI_INT = 4
L_LDB = 5
L_LDA = 6
L_IMBW = 7
L_SLOPE_B = 8
L_SLOPE_A = 9
L_AGGR = 10
L_LTC = 11
L_SLOG_OFI1 = 12
L_SLOG_SV = 13
L_NOFI = 14
L_NDEP = 15
N_LAYOUT = 17  # registry.N_LAYOUT: L[N_LAYOUT + e] = column of declared input e
N_CODES = 9  # registry.N_CODES: built-in input codes; code N_CODES + e = declared input e


@jit
def slog(x):
    """Signed log ``sign(x) log(1 + |x|)`` (NaN stays NaN)."""
    if x < 0.0:
        return -math.log1p(-x)
    return math.log1p(x)


@jit
def ofi_level(pb0, qb0, pa0, qa0, pb1, qb1, pa1, qa1):
    """OFI of one level (Cont, Kukanov & Stoikov 2014); index 0 = previous row, 1 = current."""
    if math.isnan(pb0):
        pb0 = -math.inf
        qb0 = 0.0
    if math.isnan(pb1):
        pb1 = -math.inf
        qb1 = 0.0
    if math.isnan(pa0):
        pa0 = math.inf
        qa0 = 0.0
    if math.isnan(pa1):
        pa1 = math.inf
        qa1 = 0.0
    e = 0.0
    if pb1 >= pb0:
        e += qb1
    if pb1 <= pb0:
        e -= qb0
    if pa1 <= pa0:
        e -= qa1
    if pa1 >= pa0:
        e += qa0
    return e


@jit
def _size(px, sz, i, m):
    """Size of a level, 0 if the level is empty (NaN price)."""
    if math.isnan(px[i, m]):
        return 0.0
    return sz[i, m]


@jit
def rowwise_row(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out, i):
    """Every row-wise feature of row ``i`` (reads rows i and i-1) into ``out[:, i]``."""
    n_lv = bid_px.shape[1]
    n_ofi = L[L_NOFI]
    n_dep = L[L_NDEP]
    nan = math.nan
    pb = bid_px[i, 0]
    pa = ask_px[i, 0]
    two_sided = not (math.isnan(pb) or math.isnan(pa))
    if two_sided:
        out[0, i] = 0.5 * (pb + pa)
        out[1, i] = (pa - pb) / tick
        qb = bid_sz[i, 0]
        qa = ask_sz[i, 0]
        tot = qb + qa
        if tot > 0.0:
            w = qb / tot
            out[2, i] = w * pa + (1.0 - w) * pb
            out[3, i] = (qb - qa) / tot
        else:
            out[2, i] = nan
            out[3, i] = nan
        sb = 0.0
        sa = 0.0
        for m in range(min(n_lv, 10)):
            sb += _size(bid_px, bid_sz, i, m)
            sa += _size(ask_px, ask_sz, i, m)
        tot = sb + sa
        out[4, i] = (sb - sa) / tot if tot > 0.0 else nan
        # depth-weighted imbalance
        nb = 0.0
        den = 0.0
        for m in range(n_dep):
            qbm = _size(bid_px, bid_sz, i, m)
            qam = _size(ask_px, ask_sz, i, m)
            nb += depth_w[m] * (qbm - qam)
            den += depth_w[m] * (qbm + qam)
        out[L[L_IMBW], i] = nb / den if den > 0.0 else nan
    else:
        for c in range(5):
            out[c, i] = nan
        out[L[L_IMBW], i] = nan
    # book slope per side
    for side in range(2):
        px = bid_px if side == 0 else ask_px
        sz = bid_sz if side == 0 else ask_sz
        col = L[L_SLOPE_B] if side == 0 else L[L_SLOPE_A]
        p1 = px[i, 0]
        if math.isnan(p1):
            out[col, i] = nan
        else:
            q = 0.0
            plast = p1
            for m in range(n_dep):
                if not math.isnan(px[i, m]):
                    q += sz[i, m]
                    plast = px[i, m]
            out[col, i] = q / (1.0 + abs(p1 - plast) / tick)
    # log depth per side and level
    for m in range(n_dep):
        out[L[L_LDB] + m, i] = math.log1p(_size(bid_px, bid_sz, i, m))
        out[L[L_LDA] + m, i] = math.log1p(_size(ask_px, ask_sz, i, m))
    # OFI per level and integrated
    c_ofi = L[L_OFI]
    if i == 0:
        for m in range(n_ofi):
            out[c_ofi + m, i] = nan
        out[L[L_OFI_INT], i] = nan
    else:
        tot_e = 0.0
        dep = 0.0
        for m in range(n_ofi):
            e = ofi_level(
                bid_px[i - 1, m],
                bid_sz[i - 1, m],
                ask_px[i - 1, m],
                ask_sz[i - 1, m],
                bid_px[i, m],
                bid_sz[i, m],
                ask_px[i, m],
                ask_sz[i, m],
            )
            out[c_ofi + m, i] = e
            tot_e += e
            dep += _size(bid_px, bid_sz, i, m) + _size(ask_px, ask_sz, i, m)
            dep += _size(bid_px, bid_sz, i - 1, m) + _size(ask_px, ask_sz, i - 1, m)
        dep = dep / (4.0 * n_ofi)
        out[L[L_OFI_INT], i] = tot_e / dep if dep > 0.0 else nan
    out[L[L_SLOG_OFI1], i] = slog(out[c_ofi, i])
    # trade flow
    sv = buy[i] - sell[i]
    out[L[L_SV], i] = sv
    out[L[L_SLOG_SV], i] = slog(sv)
    vol = buy[i] + sell[i]
    out[L[L_AGGR], i] = sv / vol if vol > 0.0 else 0.0
    out[L[L_LTC], i] = math.log1p(cnt[i])
    # time step and tick return
    if i == 0:
        out[L[L_LOGDT], i] = nan
        out[L[L_RET], i] = nan
    else:
        dt = (ts[i] - ts[i - 1]) / 1e9
        out[L[L_LOGDT], i] = math.log(max(dt, 1e-9))
        pb0 = bid_px[i - 1, 0]
        pa0 = ask_px[i - 1, 0]
        if two_sided and not (math.isnan(pb0) or math.isnan(pa0)):
            out[L[L_RET], i] = (0.5 * (pb + pa) - 0.5 * (pb0 + pa0)) / tick
        else:
            out[L[L_RET], i] = nan


@jit
def z_input(code, i, out, L, buy, sell, cnt):
    """Observation of recurrence input ``code`` at row ``i`` (registry.Z_*)."""
    if code == 0:
        return out[0, i]
    if code == 1:
        r = out[L[L_RET], i]
        return r * r
    if code == 2:
        return out[1, i]
    if code == 3:
        s = out[1, i]
        return math.log(s) if s > 0.0 else math.nan
    if code == 4:
        m = out[0, i]
        return math.log(m) if m > 0.0 else math.nan
    if code == 5:
        return cnt[i]
    if code == 6:
        return 1.0 if buy[i] > 0.0 else 0.0
    if code == 7:
        return 1.0 if sell[i] > 0.0 else 0.0
    if code == 8:
        return out[L[L_SV], i]
    return out[L[N_LAYOUT + code - N_CODES], i]  # a declared feature's row value


@jit
def coef(kind, code, tau, scale, interp, i, j, out, L, ts, buy, sell, cnt):
    """``(a_i, b_i)`` of one recurrence ``x_i = a_i x_{i-1} + b_i`` at row ``i``.

    ``j``: the last row before ``i`` whose input is finite (-1 if none), for the skip-NaN
    kinds (Zumbach–Müller level and deviation). Kinds: registry.K_*.
    """
    z = z_input(code, i, out, L, buy, sell, cnt)
    if kind == 3:  # exponentially decayed sum
        dt = 0.0
        if i > 0:
            dt = max(ts[i] - ts[i - 1], 0) / 1e9
        b = scale * z if math.isfinite(z) else 0.0
        return math.exp(-dt / tau), b
    if not math.isfinite(z):
        return 1.0, 0.0
    if kind == 2:  # forward fill
        return 0.0, z
    if j < 0:
        if kind == 0:
            return 0.0, z
        return 0.0, 0.0
    x = (max(ts[i] - ts[j], 0) / 1e9) / tau
    mu = math.exp(-x)
    if interp == 0:
        nu = 1.0
    elif interp == 1:
        nu = -math.expm1(-x) / x if x > 0.0 else 1.0
    else:
        nu = mu
    zp = z_input(code, j, out, L, buy, sell, cnt)
    if kind == 0:
        return mu, (nu - mu) * zp + (1.0 - nu) * z
    return mu, nu * (z - zp)


@jit
def post_row(x, st, p_int, p_tau, tick, h_mu, h_alpha, out, i):
    """Output columns computed from the recurrence states ``x`` (started flags ``st``)."""
    nan = math.nan
    for r in range(p_int.shape[0]):
        typ = p_int[r, 0]
        col = p_int[r, 1]
        s1 = p_int[r, 2]
        v = x[s1]
        if typ == 0:  # masked EMA
            out[col, i] = v if st[s1] else nan
        elif typ == 1:
            out[col, i] = v
        elif typ == 2:
            out[col, i] = h_mu + h_alpha * v
        elif typ == 3:
            out[col, i] = math.sqrt(v)
        elif typ == 4:  # z-score: dev / tick / sqrt(var_rate * tau)
            var = x[p_int[r, 3]] * p_tau[r]
            out[col, i] = v / tick / math.sqrt(var) if (st[s1] and var > 0.0) else nan
        elif typ == 5:  # trend: (EMA_fast - EMA_slow) = dev_slow - dev_fast
            var = x[p_int[r, 4]] * p_tau[r]
            d = v - x[p_int[r, 3]]
            out[col, i] = d / tick / math.sqrt(var) if (st[s1] and var > 0.0) else nan
        elif typ == 6:
            out[col, i] = math.log1p(v)
        else:
            out[col, i] = slog(v)


@jit
def fracdiff_row(y, w, i):
    """Fixed-window fractional difference ``sum_k w_k y_{i-k}``; NaN for ``i < len(w) - 1``."""
    W = w.shape[0]
    if i < W - 1:
        return math.nan
    acc = 0.0
    for k in range(W):
        acc += w[k] * y[i - k]
    return acc


@jit
def barrier_start(price, upper, lower, out_y, out_t1, out_k, t):
    """Row t's outcome set to unknown (NaN / -1 / -1); True when the row has a barrier (its
    price and widths are finite and the widths positive). Shared by the row code below and
    the CPU's block-skipping variant (:func:`alphafeat.labels._tb_rows`)."""
    out_y[t] = math.nan
    out_t1[t] = -1
    out_k[t] = -1
    p0 = price[t]
    up = upper[t]
    dn = lower[t]
    return math.isfinite(p0) and math.isfinite(up) and math.isfinite(dn) and up > 0.0 and dn > 0.0


#: Rows per block of the triple barrier's block extrema (:func:`barrier_touch`).
TB_BLOCK = 64


@jit
def barrier_touch(price, upper, lower, h, t, bmax, bmin, skip):
    """``(j, y)``: the first row ``j`` in ``(t, t + h]`` (and within ``price``) with
    ``price[j] - price[t] >= upper[t]`` (``y = 1.0``) or ``<= -lower[t]`` (``y = -1.0``);
    ``(-1, 0.0)`` when neither barrier is touched. For a row :func:`barrier_start` passed.
    ``skip``: whole blocks ``k`` of ``TB_BLOCK`` rows (``[k TB_BLOCK, (k + 1) TB_BLOCK)``) whose
    extrema ``bmax[k]`` / ``bmin[k]`` (NaN left out) touch no barrier are skipped, which is exact
    (``x -> x - p0`` is monotone in floating point; NaN never touches); else every row is
    tested and ``bmax``, ``bmin`` are not read."""
    n = price.shape[0]
    p0 = price[t]
    up = upper[t]
    dn = lower[t]
    end = min(t + h, n - 1)
    j = t + 1
    while j <= end:
        if skip and j % TB_BLOCK == 0 and j + TB_BLOCK - 1 <= end:
            k = j // TB_BLOCK
            if bmax[k] - p0 < up and bmin[k] - p0 > -dn:
                j += TB_BLOCK
                continue
        d = price[j] - p0
        if d >= up:
            return j, 1.0
        if d <= -dn:
            return j, -1.0
        j += 1
    return -1, 0.0


@jit
def barrier_outcome(ts, out_y, out_t1, out_k, t, h, n, j, y):
    """Write row t's outcome: the touch ``(j, y)`` of :func:`barrier_touch` when ``j >= 0``,
    else the timeout (0 at ``t + h``) when ``t + h`` lies within the ``n`` rows; else it stays
    unknown (as :func:`barrier_start` left it)."""
    if j >= 0:
        out_y[t] = y
        out_t1[t] = ts[j]
        out_k[t] = j
    elif t + h <= n - 1:
        out_y[t] = 0.0
        out_t1[t] = ts[t + h]
        out_k[t] = t + h


@jit
def triple_barrier_row(price, upper, lower, h, ts, out_y, out_t1, out_k, t):
    """Row t of the triple barrier (:func:`alphafeat.labels.triple_barrier`): the first row
    ``j`` in ``(t, t + h]`` with ``price[j] - price[t] >= upper[t]`` (+1) or ``<= -lower[t]``
    (-1); 0 at ``t + h`` when neither is touched; NaN / -1 / -1 where unknown, and where the
    price or a width is not finite or a width is not positive (no barrier). Every row of the
    window is tested; the CPU's :func:`alphafeat.labels._tb_rows` calls the same
    :func:`barrier_touch` with blocks skipped."""
    if barrier_start(price, upper, lower, out_y, out_t1, out_k, t):
        j, y = barrier_touch(price, upper, lower, h, t, price, price, False)
        barrier_outcome(ts, out_y, out_t1, out_k, t, h, price.shape[0], j, y)
