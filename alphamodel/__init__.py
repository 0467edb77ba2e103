"""alphamodel: PyTorch models trained on alphafeat caches — not implemented yet.

Coming: a Mamba2 state-space encoder -> CfC recurrent cell -> multi-horizon direction heads,
and a C51 distributional policy with a cost-aware backtest (``alphamodel train``).
"""
