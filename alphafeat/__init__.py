"""alphafeat: order-book features and labels from Databento DBN files of CME futures.

Stages (one module each): :mod:`alphafeat.dbn` reads DBN, :mod:`alphafeat.instruments`
selects the instrument (front month), :mod:`alphafeat.book` rebuilds the 10-level book,
:mod:`alphafeat.features` computes features (CPU) with CUDA twins in
:mod:`alphafeat.cuda`, :mod:`alphafeat.labels` makes labels, :mod:`alphafeat.cache`
writes the Arrow dataset, and :mod:`alphafeat.precompute` runs them in order.
"""

__version__ = "0.1.0"
