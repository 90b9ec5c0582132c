"""Benchmark drivers and baselines (installed as the ``gpupool_benchmarks`` package)."""
