"""`KvSizer`: token counts -> MiB of KV cache with the hardware estimator, for the gateway's request
leases and instance budgets (`gpupool serve`, `gpupool proxy`, the benches).

Invariants: a request's MiB is rounded up to whole 16-token vLLM blocks and is >= 1; a model the
catalogue does not know gets `DEFAULT_KV_BYTES_PER_TOKEN`; per-token figures are computed once per model.
"""

from __future__ import annotations

import math

BLOCK_TOKENS = 16
DEFAULT_KV_BYTES_PER_TOKEN = 128 * 1024
"""Per-token KV of Llama-3.1-8B in bf16: the estimate for models the catalogue does not know."""


class KvSizer:
    """Token counts -> MiB with the hardware KV estimator (rounded up to 16-token vLLM blocks)."""

    def __init__(self, quant: dict[str, str] | None = None) -> None:
        self._per_tok: dict[str, int] = {}
        self.quant = quant or {}

    def kv_bytes_per_token(self, model: str) -> int:
        per = self._per_tok.get(model)
        if per is None:
            from gpupool.hardware.memory import kv_bytes_per_token_of, resolve_model

            try:
                per = kv_bytes_per_token_of(resolve_model(model))
            except ValueError:
                per = DEFAULT_KV_BYTES_PER_TOKEN  # a backend serving a model the catalogue lacks
            self._per_tok[model] = per
        return per

    def request_mib(self, model: str, tokens: int) -> int:
        blocks = math.ceil(max(1, tokens) / BLOCK_TOKENS)
        return max(1, math.ceil(blocks * BLOCK_TOKENS * self.kv_bytes_per_token(model) / (1024 * 1024)))

    def instance_mib(self, model: str, tokens: int) -> int:
        from gpupool.hardware.memory import estimate

        return estimate(model, quant=self.quant.get(model, "bf16"), max_context=max(1, tokens)).total_mib

    def kv_budget_mib(self, model: str, slice_vram_mib: int, quant: str = "bf16") -> int:
        """What a slice leaves for KV cache after the model's weights and runtime overhead (>= 1)."""
        from gpupool.hardware.memory import estimate

        base = estimate(model, quant=quant, max_context=1, kv_tokens=0)
        return max(1, slice_vram_mib - base.weights_mib - base.overhead_mib)
