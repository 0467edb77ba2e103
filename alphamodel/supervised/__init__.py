"""Supervised training: the config, the checkpoint, scoring, walk-forward evaluation, baselines."""
