"""The emulated backend's token-time model: a two-term roofline per engine step.

For a model of ``P`` parameters stored at ``b`` bytes each, on a slice that has a fraction ``f`` of a
GPU with memory bandwidth ``BW`` (bytes/s) and dense bf16 peak ``F`` (FLOP/s):

- prefill of ``n`` prompt tokens:    ``t = 2 P n / (F f mfu)``              (compute bound)
- one decode step for a batch of ``B`` sequences holding ``T`` KV tokens in total:
  ``t = max((P b + T kv) / (BW f mbu), 2 P B / (F f mfu))``                 (memory vs compute bound)

with ``kv`` the KV bytes per token, ``mfu`` = 0.5 and ``mbu`` = 0.7 (typical achieved fractions).
Every sequence in the batch gets one token per decode step, so single-stream speed is ``1 / t``.
Numbers are planning-grade (datasheet peaks), not measurements; ``speed`` scales time for tests.
Host-tier KV transfers move ``bytes / pcie_bytes_s(gpu)`` (one direction of the GPU's host link, x16).
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_PEAKS: dict[str, tuple[float, float]] = {
    # name: (memory bandwidth GB/s, dense bf16 TFLOP/s) from public datasheets
    "A100-SXM4-80GB": (2039.0, 312.0),
    "A100-SXM4-40GB": (1555.0, 312.0),
    "A100-PCIE-80GB": (1935.0, 312.0),
    "A30": (933.0, 165.0),
    "H100-SXM5-80GB": (3350.0, 989.0),
    "H100-PCIE-80GB": (2000.0, 756.0),
    "H800": (3350.0, 989.0),
    "H200": (4800.0, 989.0),
    "H200-SXM-141GB": (4800.0, 989.0),
    "L40S-48GB": (864.0, 362.0),
    "L40S": (864.0, 362.0),
    "RTX-4090": (1008.0, 165.0),
}
PCIE_GB_S: dict[str, float] = {
    # host link, one direction, x16: PCIe 4.0 = 32 GB/s, PCIe 5.0 = 64 GB/s (datasheets)
    "A100-SXM4-80GB": 32.0,
    "A100-SXM4-40GB": 32.0,
    "A100-PCIE-80GB": 32.0,
    "A30": 32.0,
    "H100-SXM5-80GB": 64.0,
    "H100-PCIE-80GB": 64.0,
    "H800": 64.0,
    "H200": 64.0,
    "H200-SXM-141GB": 64.0,
    "L40S-48GB": 32.0,
    "L40S": 32.0,
    "RTX-4090": 32.0,
}
DEFAULT_GPU = "A100-SXM4-80GB"
MFU = 0.5
MBU = 0.7


def known_gpu(name: str) -> str | None:
    """The table's name of a GPU model (case and surrounding blanks ignored), None if not listed."""
    key = name.strip().lower()
    return next((k for k in GPU_PEAKS if k.lower() == key), None)


def gpu_peaks(name: str) -> tuple[float, float]:
    """(bytes/s, FLOP/s) of a GPU model; unknown names fall back to the A100-80GB."""
    bw, fl = GPU_PEAKS[known_gpu(name) or DEFAULT_GPU]
    return bw * 1e9, fl * 1e12


def pcie_bytes_s(name: str) -> float:
    """Host-link bandwidth (bytes/s, one direction) of a GPU model; unknown names: PCIe 4.0 x16."""
    return PCIE_GB_S[known_gpu(name) or DEFAULT_GPU] * 1e9


@dataclass(frozen=True, slots=True)
class Roofline:
    params: int
    bytes_per_param: float
    kv_bytes_per_token: int
    mem_bw_bytes_s: float
    peak_flops: float
    compute_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.params <= 0 or not 0 < self.compute_fraction <= 1:
            raise ValueError(
                f"roofline: params={self.params} compute_fraction={self.compute_fraction} invalid"
            )

    def prefill_s(self, prompt_tokens: int) -> float:
        return 2.0 * self.params * max(0, prompt_tokens) / (self.peak_flops * self.compute_fraction * MFU)

    def decode_step_s(self, batch: int, kv_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        mem = (self.params * self.bytes_per_param + kv_tokens * self.kv_bytes_per_token) / (
            self.mem_bw_bytes_s * self.compute_fraction * MBU
        )
        flops = 2.0 * self.params * batch / (self.peak_flops * self.compute_fraction * MFU)
        return max(mem, flops)
