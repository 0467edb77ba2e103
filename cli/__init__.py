"""Command-line entry points: ``alphafeat`` and ``alphamodel``."""
