"""Triton kernels of the CfC scan, the SSD scan and the causal convolution, and their shared checks."""
