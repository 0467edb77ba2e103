"""alphamodel: PyTorch models trained on alphafeat caches.

A Mamba2 encoder (chunked SSD, Dao & Gu 2024) -> a CfC recurrent cell (Hasani et al. 2022)
-> multi-horizon direction heads, trained with purged walk-forward splits (AFML ch. 7); a C51
trading policy on the encoder's state, backtested walk-forward.

Layers, each importing only those before it (``tests/test_layers.py`` holds them):

1. :mod:`alphamodel.errors`, :mod:`alphamodel.enums`, :mod:`alphamodel.rules` (how configs check
   their keys), :mod:`alphamodel.readout` (intervals, sessions a result needs, whether a head
   learns);
2. :mod:`alphamodel.ops` (Triton kernels and their checks);
3. :mod:`alphamodel.nn` (Mamba2, CfC, input EMA, the model and its config, optimiser groups);
4. :mod:`alphamodel.data` (the cache as windows and batches);
5. :mod:`alphamodel.supervised` (train config, checkpoint, scoring, ``train``, evaluation,
   baselines, embeddings);
6. :mod:`alphamodel.rl` (C51, its learner);
7. :mod:`alphamodel.backtest` (market, environment, strategies, walk-forward, metrics, report,
   ``backtest``);
8. :mod:`alphamodel.config` (the config-file reader);
9. :mod:`alphamodel.cli`, the command line: ``alphamodel train``, ``alphamodel backtest``,
   ``alphamodel embed``.
"""
