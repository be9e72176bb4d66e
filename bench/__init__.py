"""Benchmarks: torchdeck against plain PyTorch scripts, measured in the same invocation.

`python -m bench` runs them all (`--quick` for a smoke run, `--json PATH` for the numbers).
"""
