"""Model memory estimator: weights + KV cache + runtime overhead, in MiB.

Role: turns (model, quantisation, max context, concurrency) into the VRAM one replica needs, so the
planner can size slices and the gateway can size request leases.

Public API:
- ``QUANT_BYTES``: bytes per weight for ``bf16``/``fp16``/``fp32``/``fp8``/``int8``/``int4``/``awq``/``gptq``.
- ``kv_bytes_per_token(layers, kv_heads, head_dim, *, dtype_bytes=2)`` =
  2 x layers x kv_heads x head_dim x dtype bytes; ``kv_bytes_per_token_of(arch, kv_dtype=...)``.
- ``weights_bytes(arch, quant)``: params x bytes; 4-bit formats cost 0.52 B/weight (group-128 scales) and
  keep embeddings / lm_head in bf16.
- ``estimate(model, *, quant="bf16", max_context=..., concurrency=1, kv_dtype="bf16", kv_tokens=None)``
  -> ``MemoryEstimate`` (``weights_mib``, ``kv_cache_mib``, ``activation_mib``, ``overhead_mib``,
  ``total_mib``). ``model`` is a catalogue name, a local config.json path, or a ``ModelArch``.
- ``kv_tokens_that_fit(arch, vram_mib, ...)``: how many KV tokens fit in a slice after weights.

Invariants:
- All results are integers (MiB rounded up); the estimate is monotone in context and concurrency.
- Runtime overhead = ``CUDA_CONTEXT_MIB`` + 5 % of weights + KV clamped to [256, 2048] MiB; engine
  specific numbers are unverified (fact sheet 7.1) and should be measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gpupool.hardware.models import ModelArch, load_hf_config, model_arch

MIB = 1024 * 1024

QUANT_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.52,
    "awq": 0.52,
    "gptq": 0.52,
}
"""Bytes per weight. 4-bit formats carry fp16 scales and packed zeros at group size 128 (~0.52 B)."""

KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp32": 4}

CUDA_CONTEXT_MIB = 512
"""CUDA context + allocator slack per process (fact sheet: 'several hundred MiB'; unverified)."""
MIN_WORKSPACE_MIB = 256
MAX_WORKSPACE_MIB = 2048
WORKSPACE_FRACTION = 0.05


class BadQuantisationError(ValueError):
    def __init__(self, field: str, value: object, known: list[str]) -> None:
        super().__init__(f"unknown {field} {value!r} (known: {', '.join(known)})")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, *, dtype_bytes: int = 2) -> int:
    """KV cache bytes one token costs: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token_of(arch: ModelArch, *, kv_dtype: str = "bf16") -> int:
    """Per-token KV bytes of a model; 0 for encoders (no KV cache)."""
    if not arch.is_decoder:
        return 0
    if kv_dtype not in KV_DTYPE_BYTES:
        raise BadQuantisationError("kv_dtype", kv_dtype, sorted(KV_DTYPE_BYTES))
    return kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, dtype_bytes=KV_DTYPE_BYTES[kv_dtype])


def weights_bytes(arch: ModelArch, quant: str = "bf16") -> int:
    if quant not in QUANT_BYTES:
        raise BadQuantisationError("quant", quant, sorted(QUANT_BYTES))
    per = QUANT_BYTES[quant]
    params = arch.param_count
    if per < 1.0:
        emb = arch.embedding_params
        return math.ceil((params - emb) * per + emb * 2)
    return math.ceil(params * per)


def _activation_bytes(arch: ModelArch, max_context: int, concurrency: int) -> int:
    """Encoders: one layer's hidden states and attention scores for a full batch (fp16, naive attention)."""
    if arch.is_decoder:
        return 0
    tokens = concurrency * max_context
    hidden = tokens * (4 * arch.hidden + arch.intermediate) * 2
    scores = concurrency * arch.heads * max_context * max_context * 2
    return hidden + scores


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    model: str
    quant: str
    weights_mib: int
    kv_cache_mib: int
    activation_mib: int
    overhead_mib: int
    kv_bytes_per_token: int
    kv_tokens: int

    @property
    def total_mib(self) -> int:
        return self.weights_mib + self.kv_cache_mib + self.activation_mib + self.overhead_mib


def resolve_model(model: str | ModelArch, *, base_dir: Path | None = None) -> ModelArch:
    """A ``ModelArch`` from a catalogue name, a local config.json / model directory, or itself."""
    if isinstance(model, ModelArch):
        return model
    looks_like_path = "/" in model and (model.startswith((".", "/", "~")) or model.endswith(".json"))
    if looks_like_path:
        p = Path(model).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        return load_hf_config(p)
    return model_arch(model)


def estimate(
    model: str | ModelArch,
    *,
    quant: str = "bf16",
    max_context: int | None = None,
    concurrency: int = 1,
    kv_dtype: str = "bf16",
    kv_tokens: int | None = None,
) -> MemoryEstimate:
    """VRAM one replica needs: weights + KV for ``concurrency`` sequences of ``max_context`` tokens
    (or ``kv_tokens`` in total) + activations (encoders) + CUDA context and workspace."""
    arch = resolve_model(model)
    ctx = arch.max_positions if max_context is None else max_context
    if ctx <= 0 or concurrency <= 0:
        raise ValueError(f"max_context={ctx} and concurrency={concurrency} must be positive")
    w = weights_bytes(arch, quant)
    per_tok = kv_bytes_per_token_of(arch, kv_dtype=kv_dtype)
    tokens = (ctx * concurrency if kv_tokens is None else kv_tokens) if arch.is_decoder else 0
    kv = per_tok * tokens
    act = _activation_bytes(arch, ctx, concurrency)
    weights_mib = math.ceil(w / MIB)
    kv_mib = math.ceil(kv / MIB)
    act_mib = math.ceil(act / MIB)
    workspace = min(
        MAX_WORKSPACE_MIB, max(MIN_WORKSPACE_MIB, math.ceil(WORKSPACE_FRACTION * (weights_mib + kv_mib)))
    )
    return MemoryEstimate(
        model=arch.name,
        quant=quant,
        weights_mib=weights_mib,
        kv_cache_mib=kv_mib,
        activation_mib=act_mib,
        overhead_mib=CUDA_CONTEXT_MIB + workspace,
        kv_bytes_per_token=per_tok,
        kv_tokens=tokens,
    )


def kv_tokens_that_fit(
    arch: ModelArch | str, vram_mib: int, *, quant: str = "bf16", kv_dtype: str = "bf16"
) -> int:
    """KV tokens that fit in ``vram_mib`` after weights and runtime overhead (0 if the weights do not)."""
    a = resolve_model(arch)
    base = estimate(a, quant=quant, max_context=1, concurrency=1, kv_dtype=kv_dtype, kv_tokens=0)
    free_mib = vram_mib - base.weights_mib - base.overhead_mib
    per_tok = kv_bytes_per_token_of(a, kv_dtype=kv_dtype)
    if free_mib <= 0 or per_tok == 0:
        return 0
    # the workspace grows with KV (5 %); keep it inside the budget
    return int(free_mib * MIB / (per_tok * (1 + WORKSPACE_FRACTION)))
