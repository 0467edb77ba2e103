"""How far can anything get on a history-signal market? A fixed score beside the baselines.

The generator's ``history`` signal (``alphafeat synth --signal-kind history``) tilts the next
move by ``tanh(F / 100)``, ``F`` the signed traded volume decayed by ``exp(-1 / 600)`` per book
event. This script scores every fold's test rows with the same exponentially decayed sum of
the cache's ``signed_volume`` (per session, causal, nothing fitted: ``--rows`` sets the decay)
and puts it beside the logistic-regression and MLP baselines fitted as ``alphamodel train``
fits them, on the same walk-forward folds, purge, embargo and paired session bootstrap. The
fixed score's lift over the best baseline is about what a model that found the signal could
show at this data size (diagnostic only; not a baseline of ``alphamodel train``).

    python bench/history_oracle.py --cache /tmp/e19/cache24
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy.signal import lfilter

from alphamodel.data.cache import CacheData
from alphamodel.supervised import baselines as bl
from alphamodel.supervised.evaluation import bootstrap_aucs, percentile_interval, session_groups, walk_forward_folds


def decayed_flow(data: CacheData, rows: float) -> np.ndarray:
    """``F_t = lam F_(t-1) + signed_volume_t`` per segment from 0, ``lam = exp(-1/rows)``; (N,) float64."""
    lam = math.exp(-1.0 / rows)
    return np.concatenate([lfilter([1.0], [1.0, -lam], np.nan_to_num(s.cols["signed_volume"].astype(np.float64)))
                           for s in data.segments])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rows", type=float, default=600.0, help="decay of the fixed score, rows (e-folding)")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--embargo", type=float, default=0.01)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t_start = time.perf_counter()
    data = CacheData.open(args.cache)
    t0, t1s = data.spans()
    sessions = np.concatenate([np.full(s.n, s.session or f"segment {k}", dtype=object)
                               for k, s in enumerate(data.segments)])
    skey = np.unique(sessions, return_inverse=True)[1].astype(np.int64)
    folds = walk_forward_folds(t0, t1s, skey, args.folds, int(args.embargo * t0.size))
    flow = decayed_flow(data, args.rows)
    names = ["fixed_flow", "logistic", "mlp"]
    parts: dict[str, list] = {"rows": [], "y": [], "fold": [], **{n: [] for n in names}}
    for fold in folds:
        data.set_label_mask(fold.keep)
        norm = data.fit_normaliser(fold.train, seed=args.seed)
        rows = np.sort(fold.test)
        x_tr, y_tr, x_te = bl.baseline_inputs(data, fold.train, rows, 200_000, args.seed, norm)
        H = len(data.horizons)
        parts["logistic"].append(np.stack([bl.fit_logistic(x_tr, y_tr[:, j], x_te, 200_000, args.seed)
                                           for j in range(H)], axis=1))
        parts["mlp"].append(bl.fit_mlp(x_tr, y_tr, x_te, 200_000, args.seed))
        parts["fixed_flow"].append(np.repeat(flow[rows, None], H, axis=1))
        parts["rows"].append(rows)
        parts["y"].append(data.gather(rows, data.feature_names[:1])[1])
        parts["fold"].append(np.full(rows.size, fold.index))
    rows, y, strata = (np.concatenate(parts[k]) for k in ("rows", "y", "fold"))
    groups, unit = session_groups(skey[rows])
    out = []
    print(f"fixed score: signed volume decayed over {args.rows:g} rows, nothing fitted; pooled test of "
          f"{len(folds)} folds, {rows.size:,} rows; 95% bootstrap over {unit}")
    print(f"{'h':>5} " + " ".join(f"{n:>22}" for n in names) + "   fixed_flow - best baseline [95%]")
    for j, h in enumerate(data.horizons):
        mat = np.stack([np.concatenate(parts[n])[:, j] for n in names], axis=1)
        point, reps = bootstrap_aucs(mat, y[:, j], groups, args.n_boot, args.seed + j, strata)
        kb = 1 + int(np.argmax(point[1:]))
        lo, hi = percentile_interval(reps[:, 0] - reps[:, kb])
        rec = {"horizon": h, "best_baseline": names[kb], "lift": float(point[0] - point[kb]),
               "lift_ci": [float(lo), float(hi)]}
        cells = []
        for k, n in enumerate(names):
            a, b = percentile_interval(reps[:, k])
            rec[n] = [float(point[k]), float(a), float(b)]
            cells.append(f"{point[k]:.3f} [{a:.3f},{b:.3f}]".rjust(22))
        out.append(rec)
        print(f"{h:>5} " + " ".join(cells) + f"   {rec['lift']:+.3f} [{lo:+.3f},{hi:+.3f}] vs {names[kb]}")
    print(json.dumps({"bench": "history_oracle", "cache": args.cache, "rows_decay": args.rows,
                      "sessions": int(np.unique(skey).size), "test_rows_pooled": int(rows.size),
                      "seconds": time.perf_counter() - t_start, "horizons": out}))


if __name__ == "__main__":
    main()
