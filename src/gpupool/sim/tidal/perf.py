"""Inference performance model of the tidal simulation: a roofline per slice, with cited constants.

Role: turns (model, slice, tokens) into GPU seconds. Nothing here is fitted to a target figure.

Model (documented in docs/tidal/REPORT.md, "Performance model"):
- Prefill is compute-bound: ``t = flops / (peak_bf16 * sm_fraction * ETA_PREFILL)`` with
  ``flops = 2 * params * tokens + 4 * layers * hidden * tokens**2 / 2`` (dense matmuls plus causal
  attention). Int4 weight-only kernels dequantise to bf16, so prefill runs at the bf16 tensor rate.
- Decode is memory-bandwidth-bound: one iteration reads the weights once plus the live KV cache:
  ``t_iter = (weight_bytes + kv_bytes_live) / (bandwidth * mem_fraction * ETA_BANDWIDTH)``, and is
  never faster than its own compute ``2 * params * batch / (peak * sm_fraction * ETA_PREFILL)``.
- Encoders (embedding, rerank) are one compute-bound forward pass: ``2 * params * tokens``.
- A slice's compute fraction is its SM count over the card's SMs (MIG: 14 SMs per 1g of 108 on
  A100); MPS shares get their thread percentage. Memory bandwidth follows MIG memory slices
  (k/8 of the card) and is shared (fraction 1.0 upper bound) under MPS.

Constants (public spec sheets, dense, no sparsity):
- NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16 tensor 312 TFLOPS (624 with sparsity),
  HBM2e 2,039 GB/s (we use 2.0e12 B/s), 108 SMs, 80 GB.
- NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS (733 with sparsity), GDDR6 864 GB/s, 142 SMs,
  48 GB.
- ETA_PREFILL = 0.55 and ETA_BANDWIDTH = 0.80 are assumptions (typical achieved fractions of peak
  for large GEMMs and for streaming reads); they are inputs, stated in the report, not measured here.

Pauser costs (public sources: vLLM's sleep mode, llm-d's fast model actuation, NVIDIA's cuda-checkpoint):
- vLLM sleep level 1 wake: weights copied back from pinned host memory; llm-d FMA measured ~3 s for
  64 GiB, i.e. ~21 GiB/s; sleeping (offload) runs at the same rate; the KV cache is discarded.
- cuda-checkpoint: device memory copied to host; ~15 s per 80 GB-class GPU toggle (#29), i.e.
  ~5.3 GB/s; restore at the same rate. Not supported on MIG slices (gpu-facts 5.1, issue #42).
- MIG re-partition: destroy + create GPU instances on a drained GPU; the reference gives no
  measured figure, we assume RECONFIG_S = 5 s (unverified) plus the engines' cold load from host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

GIB = 1024**3
ETA_PREFILL = 0.55
ETA_BANDWIDTH = 0.80
SLEEP_L1_GIB_S = 64.0 / 3.0
CUDA_CKPT_GB_S = 80.0 / 15.0
RECONFIG_S = 5.0
HOLDBACK_S = 0.002
"""Stopping P2 admission at the gateway: one scheduling decision (milliseconds)."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    bf16_flops: float
    mem_bw_bytes_s: float
    sm_count: int
    memory_mib: int
    source: str


A100_80GB = GpuSpec(
    "A100-SXM4-80GB", 312e12, 2.0e12, 108, 81920, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"
)
L40S = GpuSpec("L40S-48GB", 362.05e12, 864e9, 142, 46068, "NVIDIA L40S datasheet")
GPUS = {g.name: g for g in (A100_80GB, L40S)}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One served model. ``kind`` is ``decoder`` or ``encoder``; bytes are what the weights occupy."""

    name: str
    kind: str
    params: float
    weight_bytes: float
    layers: int
    hidden: int
    kv_bytes_per_token: int
    source: str


# gpu-facts.md section 7.2 / 7.3 (config.json values; int4 size from the group-128 estimate).
QWEN25_14B_AWQ = ModelSpec(
    "Qwen2.5-14B-Instruct-AWQ", "decoder", 14.77e9, 9.3 * GIB, 48, 5120, 196_608, "gpu-facts 7.2"
)
QWEN25_7B_AWQ = ModelSpec(
    "Qwen2.5-7B-Instruct-AWQ", "decoder", 7.62e9, 5.2 * GIB, 28, 3584, 57_344, "gpu-facts 7.2"
)
QWEN25_32B_AWQ = ModelSpec(
    "Qwen2.5-32B-Instruct-AWQ", "decoder", 32.76e9, 18.0 * GIB, 64, 5120, 262_144, "gpu-facts 7.2"
)
QWEN25_05B = ModelSpec(
    "Qwen2.5-0.5B-Instruct", "decoder", 0.49e9, 0.92 * GIB, 24, 896, 12_288, "gpu-facts 7.2"
)
BGE_M3 = ModelSpec("BAAI/bge-m3", "encoder", 567.8e6, 1.06 * GIB, 24, 1024, 0, "gpu-facts 7.3")
BGE_RERANK = ModelSpec(
    "BAAI/bge-reranker-v2-m3", "encoder", 567.8e6, 1.06 * GIB, 24, 1024, 0, "gpu-facts 7.3"
)


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Compute and bandwidth of one slice of one GPU, as fractions of the whole card."""

    gpu: GpuSpec
    sm_fraction: float
    mem_fraction: float
    vram_mib: int
    label: str

    @property
    def flops(self) -> float:
        return self.gpu.bf16_flops * self.sm_fraction * ETA_PREFILL

    @property
    def bandwidth(self) -> float:
        return self.gpu.mem_bw_bytes_s * self.mem_fraction * ETA_BANDWIDTH


def whole(gpu: GpuSpec) -> SliceSpec:
    return SliceSpec(gpu, 1.0, 1.0, gpu.memory_mib, "whole")


def mig(gpu: GpuSpec, *, sm_count: int, memory_slices: int, memory_mib: int, label: str) -> SliceSpec:
    return SliceSpec(gpu, sm_count / gpu.sm_count, memory_slices / 8, memory_mib, label)


def mps(gpu: GpuSpec, *, pct: int, vram_mib: int, label: str) -> SliceSpec:
    return SliceSpec(gpu, pct / 100, 1.0, vram_mib, label)


FloatArray = npt.NDArray[np.float64]


def forward_flops(m: ModelSpec, tokens: FloatArray) -> FloatArray:
    """Dense matmuls plus (causal for decoders) attention over ``tokens`` in one pass."""
    attn = 4.0 * m.layers * m.hidden * tokens * tokens
    if m.kind == "decoder":
        attn = attn / 2
    return 2.0 * m.params * tokens + attn


def prefill_s(m: ModelSpec, s: SliceSpec, tokens: FloatArray) -> FloatArray:
    return forward_flops(m, tokens) / s.flops


def decode_iter_s(m: ModelSpec, s: SliceSpec, *, batch: float, ctx_tokens: float) -> float:
    """One decode iteration for ``batch`` sequences of ``ctx_tokens`` average context."""
    mem = (m.weight_bytes + batch * ctx_tokens * m.kv_bytes_per_token) / s.bandwidth
    comp = 2.0 * m.params * batch / s.flops
    return max(mem, comp)


def max_batch(m: ModelSpec, s: SliceSpec, *, ctx_tokens: float, util: float = 0.9, cap: int = 256) -> int:
    """Sequences whose KV fits in ``util`` of the slice after the weights (vLLM-style reservation)."""
    free = s.vram_mib * 1024 * 1024 * util - m.weight_bytes - 1.0 * GIB
    if m.kv_bytes_per_token == 0:
        return cap
    return max(0, min(cap, int(free // (ctx_tokens * m.kv_bytes_per_token))))


def batch_tokens_per_s(m: ModelSpec, s: SliceSpec, *, prompt: float, output: float) -> float:
    """Offline throughput (prompt + output tokens per second) at the largest batch that fits."""
    if m.kind == "encoder":
        return float(prompt / prefill_s(m, s, np.array([prompt]))[0])
    b = max_batch(m, s, ctx_tokens=prompt + output / 2)
    if b == 0:
        return 0.0
    per_req = (
        float(prefill_s(m, s, np.array([prompt]))[0])
        + output * decode_iter_s(m, s, batch=b, ctx_tokens=prompt + output / 2) / b
    )
    return (prompt + output) / per_req


def sleep_l1_s(m: ModelSpec) -> float:
    """vLLM sleep level 1 (offload) or wake: weights over the measured ~21 GiB/s host copy."""
    return m.weight_bytes / GIB / SLEEP_L1_GIB_S


def cuda_checkpoint_s(footprint_bytes: float) -> float:
    """cuda-checkpoint suspend (or restore) of a process holding ``footprint_bytes`` of VRAM."""
    return footprint_bytes / 1e9 / CUDA_CKPT_GB_S


def cold_load_s(m: ModelSpec) -> float:
    """Engine start on a fresh slice: weights from host page cache (same copy path) + 10 s init."""
    return sleep_l1_s(m) + 10.0
