"""The main job as a package: DBN files -> features and labels -> Arrow cache.

Layers, each importing only those before it: :mod:`~alphafeat.precompute.config` (the options)
-> :mod:`~alphafeat.precompute.job` (what a worker needs, thread sizing) ->
:mod:`~alphafeat.precompute.books` (a segment's book: decoded, kept, in blocks) ->
:mod:`~alphafeat.precompute.table` (the stored columns) -> :mod:`~alphafeat.precompute.relabel`
-> :mod:`~alphafeat.precompute.segment` (one segment, in a worker) ->
:mod:`~alphafeat.precompute.workers` (joblib, Dask) -> :mod:`~alphafeat.precompute.manifest`
-> :mod:`~alphafeat.precompute.run` (:func:`precompute`: plan, decide, map, fold, commit).
"""

from alphafeat.precompute.config import DEFAULT_DATA_DIR, PrecomputeConfig
from alphafeat.precompute.run import Summary, precompute

__all__ = ["DEFAULT_DATA_DIR", "PrecomputeConfig", "Summary", "precompute"]
