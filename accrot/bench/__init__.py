"""Benchmarks that print side-by-side ratios measured in one run: every scheme against NoPE, the PaTH kernels, the
Lightning loop against a bare PyTorch loop (`accrot bench`)."""
