"""The cache as tensors: memory-mapped windows, normalisation, batches."""
