"""`vllm_args`: the ``vllm serve`` arguments of one planned model instance: its memory share, its
context, prefix caching and the KV host tier (the engine half of the KV-cache line of defence).

Flags, as vLLM's engine arguments name them:
- ``--gpu-memory-utilization F``: the share of the device's memory the instance may take (weights,
  activations and KV cache). A MIG instance or a whole card is the instance's own device: 0.9, vLLM's
  default (the rest is the margin the gateway's red line mirrors). An MPS share sees the whole card:
  its VRAM cap / the card's memory.
- ``--max-model-len N``: the workload's ``max_context``.
- ``--enable-prefix-caching``: automatic prefix caching (on by default in vLLM's V1 engine; written
  out so the plan says what the gateway's prefix-aware routing relies on). Decoder models only.
- ``--kv-offloading-backend native|lmcache --kv-offloading-size GIB``: KV blocks evicted from the GPU
  are kept in a host-memory buffer of GIB GiB (vLLM's native offloading connector, or LMCache), so a
  returning session's prefix costs a PCIe copy instead of a recompute. Sized by `host_tier_gib`.

Role: pure; hardware layer (standard library only). Invariants: every size is an integer GiB >= 1
(no host tier flags at all when the share rounds to 0 GiB); the arguments are a list, never one
shell string.
"""

from __future__ import annotations

from gpupool.hardware.slices import SliceKind

OFFLOAD_BACKENDS = ("native", "lmcache")
DEFAULT_UTILIZATION = 0.9


def host_tier_gib(host_ram_gib: int, instances: int, fraction_pct: int = 50) -> int:
    """GiB of host memory per instance for the KV host tier: ``fraction_pct`` % of the node's RAM,
    split evenly over the ``instances`` vLLM instances on that node (floor; 0 when none fits)."""
    if host_ram_gib < 0 or instances < 1 or not 0 <= fraction_pct <= 100:
        raise ValueError(f"host_ram_gib={host_ram_gib} instances={instances} fraction_pct={fraction_pct}")
    return host_ram_gib * fraction_pct // 100 // instances


def vllm_args(
    *,
    model: str,
    kind: SliceKind,
    slice_vram_mib: int,
    gpu_memory_mib: int,
    max_context: int,
    decoder: bool = True,
    offload_backend: str = "native",
    offload_gib: int = 0,
) -> list[str]:
    """``vllm serve`` arguments for ``model`` on one slice (see the module docstring)."""
    if offload_backend not in OFFLOAD_BACKENDS:
        raise ValueError(f"offload_backend {offload_backend!r}: expected native or lmcache")
    if slice_vram_mib < 1 or gpu_memory_mib < 1 or max_context < 1 or offload_gib < 0:
        raise ValueError(
            f"slice_vram_mib={slice_vram_mib} gpu_memory_mib={gpu_memory_mib} "
            f"max_context={max_context} offload_gib={offload_gib}"
        )
    if kind in (SliceKind.MPS, SliceKind.TIME_SLICE):
        util = min(DEFAULT_UTILIZATION, slice_vram_mib / gpu_memory_mib)
    else:
        util = DEFAULT_UTILIZATION
    args = ["vllm", "serve", model, "--gpu-memory-utilization", f"{util:.3f}".rstrip("0").rstrip(".")]
    args += ["--max-model-len", str(max_context)]
    if decoder:
        args.append("--enable-prefix-caching")
        if offload_gib >= 1:
            args += ["--kv-offloading-backend", offload_backend, "--kv-offloading-size", str(offload_gib)]
    return args
