"""The proxy's checks of a request's size and wait, before any lease: the context-length error in
OpenAI's shape, the ``x-gpupool-queue-timeout`` header, and the ``/tokenize`` body and thresholds.

Role: pure functions used by `gpupool.adapters.http.proxy` (no I/O here). Invariant: every refusal is
an `OpenAIError` with status 400 that names the field or header and the value it got.
"""

from __future__ import annotations

import json
from typing import Any

from gpupool.adapters.http.openai_request import CHAT, COMPLETIONS, EMBEDDINGS, OpenAIError, Shape

NEAR_CONTEXT = 0.8
"""Ask ``/tokenize`` when the estimated prompt + max_tokens exceeds this share of the context."""
TOKENIZE_TIMEOUT_S = 5.0
"""A ``/tokenize`` that takes longer is abandoned and the estimate is used (the backend still checks)."""


def tokenize_body(model: str, body: dict[str, Any], kind: str) -> bytes | None:
    if kind == CHAT:
        doc: dict[str, Any] = {"model": model, "messages": body["messages"], "add_generation_prompt": True}
    else:
        text = body.get("input" if kind == EMBEDDINGS else "prompt")
        if not isinstance(text, str):
            return None  # list prompts are not worth a round trip each
        doc = {"model": model, "prompt": text}
    return json.dumps(doc, separators=(",", ":")).encode()


def over_budget(model: str, need_mib: int, most_mib: int, shape: Shape, kind: str) -> OpenAIError:
    """A request whose KV cache (its prompts, and ``n`` x ``max_tokens`` per prompt) is larger than
    the KV budget of every instance of its model: no wait and no other pool state can serve it, so
    it is the client's to change (400 naming the field to lower), not a 503 an SDK would retry."""
    param = "input" if kind == EMBEDDINGS else "n" if shape.n > 1 else shape.max_tokens_param
    return OpenAIError(
        400,
        f"this request needs {need_mib} MiB of KV cache (prompt tokens + n={shape.n} x"
        f" {shape.max_tokens_param}={shape.max_tokens} per prompt, {shape.prompts} prompt(s)); the largest"
        f" KV budget of an instance of model {model!r} is {most_mib} MiB: lower n or"
        f" {shape.max_tokens_param}, or shorten the prompt",
        param=param,
        code="kv_budget_exceeded",
    )


QUEUE_TIMEOUT_HEADER = "x-gpupool-queue-timeout"


def queue_timeout(value: str | None, max_wait_s: float) -> float | None:
    """Seconds the request may wait in the queue (None: its band's default; 0: never queue)."""
    if value is None:
        return None
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not 0 <= v <= max_wait_s:  # also refuses nan
        raise OpenAIError(
            400,
            f"{QUEUE_TIMEOUT_HEADER} must be a number of seconds in [0, {max_wait_s:g}], got {value[:40]!r}",
            param=QUEUE_TIMEOUT_HEADER,
            code="invalid_value",
        )
    return v


def too_long(
    ctx: int, max_tokens: int, prompt: int | None, kind: str, name: str = "max_tokens"
) -> OpenAIError:
    """The context error; ``name``: the field ``max_tokens`` came from (`Shape.max_tokens_param`)."""
    what = {CHAT: "messages", COMPLETIONS: "prompt", EMBEDDINGS: "input"}[kind]
    if prompt is None:
        msg = (
            f"{name} {max_tokens} leaves no room for the {what}: this model's maximum context "
            f"length is {ctx} tokens."
        )
        param = name
    else:
        msg = (
            f"This model's maximum context length is {ctx} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the {what}, {max_tokens} in the completion). "
            f"Please reduce the length of the {what} or completion."
        )
        param = what
    return OpenAIError(400, msg, param=param, code="context_length_exceeded")


__all__ = [
    "NEAR_CONTEXT",
    "QUEUE_TIMEOUT_HEADER",
    "TOKENIZE_TIMEOUT_S",
    "queue_timeout",
    "tokenize_body",
    "too_long",
]
