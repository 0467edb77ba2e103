"""A partition written earlier, into this run's options without decoding its inputs again:
its labels recomputed from its own mid (:func:`relabel_table`), the features it lacks from the
segment's kept book (:func:`added_features`)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import numpy as np

from alphafeat.features import feature_specs
from alphafeat.features.inputs import prepare
from alphafeat.labels import direction_labels_seconds
from alphafeat.precompute.books import book_slices
from alphafeat.precompute.job import Job
from alphafeat.precompute.table import (
    barrier_widths,
    column_array,
    column_specs,
    device_features,
    feature_dtypes,
    from_numpy,
    is_label,
    label_arrays,
    label_mid,
    min_depth,
    pruned_stream,
)
from alphafeat.types import BookArrays
from alphafeat.validation import validate_barrier

if TYPE_CHECKING:  # pyarrow is imported where it is used: a run decodes its first records without it
    import pyarrow as pa

__all__ = ["added_features", "can_relabel", "relabel_changes", "relabel_table"]


def can_relabel(job: Job) -> bool:
    """Whether labels can be recomputed from a partition's own columns: the mid from
    ``bid_px_00``/``ask_px_00``/``book_crossed`` (stored in float64, so bit-identical), and a
    triple barrier only of fixed width (a ``vol`` barrier reads a feature the cache may not hold);
    not with ``preopen`` drop (the labels were computed over the dropped rows too)."""
    return job.book_levels >= 1 and (not job.barrier or validate_barrier(job.barrier).kind == "ticks") and \
        job.preopen == "keep"


def relabel_changes(table: pa.Table, job: Job) -> tuple[str, ...]:
    """What a relabel of the partition ``table`` into ``job``'s options changes, for the
    summary: ``"labels"`` (other horizons or barrier), ``"features added"`` (stored features it
    lacks, computed from the kept book), ``"features dropped"`` (stored features ``job`` does not
    ask for), ``"compression"``."""
    old, have = _label_params(table), set(table.column_names)
    ours = {c["name"] for c in column_specs(job)}
    labels = (old["horizons"] != list(job.horizons) or old["horizons_s"] != [float(x) for x in job.horizons_s]
              or old["barrier"] != job.barrier or bool(job.barrier) and old["barrier_horizon"] != job.barrier_horizon)
    dropped = any(n not in ours and not is_label(n) for n in have)
    return tuple(k for k, yes in (("labels", labels), ("features added", any(n not in have for n in job.names)),
                                  ("features dropped", dropped), ("compression", old["compression"] != job.compression))
                 if yes)  # fmt: skip


def relabel_table(table: pa.Table, job: Job, added: dict[str, np.ndarray] | None = None) -> pa.Table:
    """``table`` (a partition) with ``job``'s features and labels: the same values and columns
    as computing the segment afresh (``tests/test_cache_runs.py``).

    Its book columns are kept; its features that ``job`` stores are kept, the others dropped,
    and those it lacks come from ``added`` (stored columns by name, :func:`added_features`);
    its labels are recomputed for ``job``'s label options from its own mid and ``ts_recv``.
    A label column whose options the partition's metadata (``alphafeat`` schema key) shows
    unchanged is kept as it is (it was computed from the same mid: ``label_h{h}`` / ``t1_h{h}``
    of a horizon it holds, the triple barrier of the same ``barrier`` and ``barrier_horizon``,
    a horizon in seconds it holds); the others are computed whole-segment
    (:func:`alphafeat.labels.direction_labels`, numpy; :func:`alphafeat.labels.triple_barrier`
    and :func:`alphafeat.labels.direction_labels_seconds`), which equal the streamed labels of
    a fresh run bit for bit. Requires :func:`can_relabel`."""
    import pyarrow as pa

    from alphafeat.labels import direction_labels, triple_barrier

    old = _label_params(table)
    mid: list[np.ndarray] = []  # computed once, when a label needs it

    def inputs() -> tuple[np.ndarray, np.ndarray]:
        if not mid:
            x = column_array(table, "book_crossed", np.bool_)
            mid.append(label_mid(column_array(table, "bid_px_00", np.float64),
                                 column_array(table, "ask_px_00", np.float64), x))  # fmt: skip
            mid.append(column_array(table, "ts_recv", np.int64).copy())  # writable: the kernels' types
        return mid[0], mid[1]

    def kept(names: list[str], same: bool) -> dict[str, pa.ChunkedArray] | None:
        ok = same and all(table.schema.get_field_index(k) >= 0 for k in names)  # -1: absent (or twice)
        return {k: table.column(k) for k in names} if ok else None

    labels: dict[str, np.ndarray | pa.ChunkedArray] = {}
    for h in job.horizons:
        names = [f"label_h{h}", f"t1_h{h}"]
        labels.update(kept(names, h in old["horizons"]) or direction_labels(inputs()[0], [h], ts=inputs()[1]))
    if job.barrier:
        same = old["barrier"] == job.barrier and old["barrier_horizon"] == job.barrier_horizon
        tb = kept(["tb_label", "tb_t1"], same)
        if tb is None:
            m, ts = inputs()
            w = barrier_widths(m, None, validate_barrier(job.barrier), job)
            y, t1, _ = triple_barrier(m, w, w, job.barrier_horizon, ts)
            tb = {"tb_label": y, "tb_t1": t1}
        labels.update(tb)
    for sec in job.horizons_s:
        names = [f"label_h{sec:g}s", f"t1_h{sec:g}s"]
        labels.update(kept(names, old["horizons_s"].count(sec) == 1) or
                      direction_labels_seconds(*inputs(), [sec]))  # fmt: skip
    names = {s.name for s in feature_specs(job.features)}
    book = {k: table.column(k) for k in table.column_names if not is_label(k) and k not in names}
    feats = {k: table.column(k) if table.schema.get_field_index(k) >= 0 else from_numpy((added or {})[k])
             for k in job.names}  # fmt: skip
    return pa.table({**book, **feats, **label_arrays(labels)})


def added_features(b: BookArrays, job: Job, names: list[str], where: str = "",
                   gpu_locks: str | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """The stored columns (n,) of features ``names`` of the whole book ``b`` (a segment's kept
    book, :func:`alphafeat.precompute.books.load_book`), with the dtypes, the values and the NaN of too
    shallow a book that a fresh run stores: on the CPU a
    :class:`~alphafeat.features.cpu.FeatureStream` of the plan pruned to these features
    (:func:`~alphafeat.features.registry.prune_plan`: the same operations on the same rows,
    so the same bits), block by block; on a GPU every feature, as a fresh run computes them
    (:func:`device_features`: ``where`` names the segment, ``gpu_locks`` the run's turns)."""

    index = {s.name: k for k, s in enumerate(feature_specs(job.features))}
    out = {n: np.empty(len(b), dt) for n, dt in feature_dtypes(job, names).items()}
    if job.device == "cpu":
        stream = pruned_stream(job, index, names)
        try:
            k0 = 0
            for blk, halo in book_slices(b):
                lo = 1 if halo else 0

                def take(i0: int, i1: int, res: np.ndarray, which: frozenset[int], k: int = k0 - lo) -> None:
                    for n in names:
                        if index[n] in which:
                            out[n][k + i0 : k + i1] = res[index[n]]

                stream.push_block(prepare(blk, job.features), lo, take)
                k0 += len(blk) - lo
        finally:
            stream.close()
    else:
        wide = dataclasses.replace(b, bid_sz=np.asarray(b.bid_sz, np.float64), ask_sz=np.asarray(b.ask_sz, np.float64))

        def use(feats: dict[str, np.ndarray]) -> None:
            for n in names:
                out[n][:] = feats[n]

        device_features(wide, job, where, gpu_locks, use)
    need = min_depth(job.features)
    for n in names:
        if need[n] > b.depth:
            out[n][:] = np.nan
    return out


def _label_params(table: pa.Table) -> dict:
    """The label options a partition's metadata records (those absent: empty / None, so that
    none of its label columns is kept)."""
    from alphafeat.cache import META_KEY

    try:
        params = json.loads((table.schema.metadata or {})[META_KEY]).get("params") or {}
    except (KeyError, ValueError, AttributeError):
        params = {}
    return {"horizons": [int(h) for h in params.get("horizons") or []],
            "horizons_s": [float(s) for s in params.get("horizons_s") or []],
            "barrier": params.get("barrier"), "barrier_horizon": params.get("barrier_horizon"),
            "compression": params.get("compression")}  # fmt: skip
