"""alphamodel: PyTorch models trained on alphafeat caches.

A Mamba2 encoder (chunked SSD, Dao & Gu 2024) -> a CfC recurrent cell (Hasani et al. 2022)
-> multi-horizon direction heads, trained with purged walk-forward splits (AFML ch. 7).

Modules: :mod:`alphamodel.mamba2` (SSD scan, Mamba2 block), :mod:`alphamodel.cfc` (CfC cell),
:mod:`alphamodel.model` (network, masked loss, carried state), :mod:`alphamodel.data`
(memory-mapped windows), :mod:`alphamodel.metrics` (AUC), :mod:`alphamodel.evaluation`
(walk-forward folds over sessions, session-bootstrap intervals), :mod:`alphamodel.baselines`
(logistic, LightGBM, MLP, the generator's ceiling), :mod:`alphamodel.train` (``train``,
``load_model``). Command line: ``alphamodel train``.
"""
