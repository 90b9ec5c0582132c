"""Benchmark drivers and baselines (installed as the ``gpupool.bench`` package)."""
