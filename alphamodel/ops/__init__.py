"""Kernels below the model: Triton scans and convolutions (CUDA, or CPU in Triton's interpreter)."""
