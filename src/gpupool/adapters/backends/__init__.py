"""Inference backends: an emulated OpenAI-compatible server (roofline token timing, KV blocks, vLLM
metric names, vLLM sleep/pause endpoints) for demos and tests. FastAPI only; a real vLLM server plugs
into the gateway the same way (its URL registered as a backend)."""

from __future__ import annotations

from gpupool.adapters.backends.engine import EmulatedEngine
from gpupool.adapters.backends.roofline import Roofline, gpu_peaks, pcie_bytes_s

__all__ = ["EmulatedEngine", "Roofline", "gpu_peaks", "pcie_bytes_s"]
