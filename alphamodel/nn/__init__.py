"""The network: Mamba2 blocks, the CfC cell, the input EMA bank, the model and its optimiser groups."""
