"""alphafeat: order-book features and labels from Databento DBN files of CME futures.

Stages (one module each): :mod:`alphafeat.dbn` reads DBN, :mod:`alphafeat.instruments`
selects the instrument (front month), :mod:`alphafeat.book` rebuilds the 10-level book,
:mod:`alphafeat.features` computes features (CPU) with CUDA twins in
:mod:`alphafeat.cuda`, :mod:`alphafeat.labels` makes labels, :mod:`alphafeat.cache`
writes the Arrow dataset, and :mod:`alphafeat.precompute` runs them in order.

Layers, each importing only those before it (``tests/layers.py`` holds them, with the layers
inside :mod:`alphafeat.precompute`):

1. :mod:`~alphafeat.errors`, :mod:`~alphafeat.types`, :mod:`~alphafeat.cores`,
   :mod:`~alphafeat.arena`, :mod:`~alphafeat.zstd_frames`;
2. :mod:`~alphafeat.validation`, :mod:`~alphafeat.options` (options declared once, on config fields);
3. :mod:`~alphafeat.dbn`, :mod:`~alphafeat.kept`, :mod:`~alphafeat.cache`, :mod:`~alphafeat.splits`;
4. :mod:`~alphafeat.instruments`, :mod:`~alphafeat.book`, :mod:`~alphafeat.bars`;
5. :mod:`alphafeat.features` (the CPU path);
6. :mod:`alphafeat.cuda` (the GPU path);
7. :mod:`~alphafeat.labels`, :mod:`~alphafeat.devices` (the features on either device);
8. :mod:`~alphafeat.plan` (its scans: :mod:`~alphafeat.plan_scan`), :mod:`~alphafeat.inspection`;
9. :mod:`alphafeat.precompute`;
10. :mod:`alphafeat.synth` (the session generator);
11. :mod:`~alphafeat.commandline` (what both command lines share), :mod:`~alphafeat.cli` (the
    ``alphafeat`` command line).
"""

__version__ = "0.1.0"
