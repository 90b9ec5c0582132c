"""`create_backend_app`: an OpenAI-compatible emulated inference server over one `EmulatedEngine`.

Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (``stream: true`` -> SSE chunks
then ``data: [DONE]``), ``/v1/embeddings`` (deterministic vectors from a hash of the input), ``/health``,
``/metrics`` (vLLM names: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:time_to_first_token_seconds``, ``vllm:num_preemptions_total``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:cache_config_info``) and vLLM's
sleep/pause endpoints: ``POST /sleep?level=1|2``, ``POST /wake_up``, ``GET /is_sleeping``,
``POST /pause``, ``POST /resume``, ``GET /is_paused``. The body's ``priority`` is vLLM's (lower = more
urgent). Prompt tokens are estimated as characters / 4, as the gateway does. No module-level state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from gpupool.adapters.backends.engine import TTFT_BUCKETS, EmulatedEngine, Sequence


def _tokens(x: Any) -> int:
    if isinstance(x, str):
        return math.ceil(len(x) / 4)
    if isinstance(x, list):
        return sum(_tokens(y) for y in x)
    if isinstance(x, dict):
        return _tokens(x.get("content", x.get("text", "")))
    return 1 if isinstance(x, int) else 0


def _embedding(text: str, dim: int) -> list[float]:
    out: list[float] = []
    i = 0
    while len(out) < dim:
        h = hashlib.sha256(f"{i}:{text}".encode()).digest()
        out.extend((v / 2**31) - 1.0 for v in struct.unpack("<8I", h))
        i += 1
    return out[:dim]


def create_backend_app(engine: EmulatedEngine, *, model: str, embedding_dim: int = 64) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title=f"gpupool emulated backend ({model})", lifespan=lifespan)

    def bad(msg: str, status: int = 400) -> JSONResponse:
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error"}}, status_code=status)

    async def parse(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return bad("body must be JSON")
        if not isinstance(body, dict):
            return bad("body must be a JSON object")
        if body.get("model", model) != model:
            return bad(f"model {body.get('model')!r} is not served here (serving {model!r})", 404)
        return body

    def prio(body: dict[str, Any]) -> int:
        p = body.get("priority", 0)
        return p if isinstance(p, int) and not isinstance(p, bool) else 0

    def max_tokens(body: dict[str, Any]) -> int:
        m = body.get("max_tokens", body.get("max_completion_tokens", 16))
        return m if isinstance(m, int) and not isinstance(m, bool) and 0 <= m <= 1_000_000 else 16

    async def generate(request: Request, body: dict[str, Any], *, chat: bool) -> Response:
        prompt = _tokens(body.get("messages" if chat else "prompt", ""))
        seq = engine.submit(prompt, max_tokens(body), prio(body))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def piece(n: int) -> str:
            return f" tok{n}"

        if body.get("stream"):

            async def stream() -> AsyncIterator[bytes]:
                try:
                    while (n := await seq.out.get()) is not None:
                        delta: dict[str, Any] = (
                            {"index": 0, "delta": {"content": piece(n)}, "finish_reason": None}
                            if chat
                            else {"index": 0, "text": piece(n), "finish_reason": None}
                        )
                        chunk = {
                            "id": rid,
                            "object": obj + ".chunk" if chat else obj,
                            "created": created,
                            "model": model,
                            "choices": [delta],
                        }
                        yield f"data: {json.dumps(chunk)}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                finally:
                    engine.abort(seq)

            return StreamingResponse(stream(), media_type="text/event-stream")
        try:
            text = await _collect(seq, piece)
        finally:
            engine.abort(seq)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": seq.generated,
            "total_tokens": prompt + seq.generated,
        }
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        )

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "gpupool-emulator"}]}
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse(request)
        return body if isinstance(body, JSONResponse) else await generate(request, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await parse(request)
        return body if isinstance(body, JSONResponse) else await generate(request, body, chat=True)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await parse(request)
        if isinstance(body, JSONResponse):
            return body
        inputs = body.get("input", "")
        items = inputs if isinstance(inputs, list) else [inputs]
        seq = engine.submit(_tokens(items), 0, prio(body))
        try:
            while await seq.out.get() is not None:
                pass
        finally:
            engine.abort(seq)
        data = [
            {"object": "embedding", "index": i, "embedding": _embedding(str(x), embedding_dim)}
            for i, x in enumerate(items)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": seq.prompt_tokens, "total_tokens": seq.prompt_tokens},
            }
        )

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(engine, model), media_type="text/plain; version=0.0.4")

    @app.post("/sleep")
    async def sleep(level: int = 1) -> Response:
        if level not in (1, 2):
            return bad("level must be 1 or 2")
        engine.sleep(level)
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up() -> Response:
        engine.wake_up()
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": engine.sleep_level > 0})

    @app.post("/pause")
    async def pause(mode: str = "keep") -> Response:
        if mode not in ("keep", "wait", "abort"):
            return bad("mode must be keep, wait or abort")
        if mode == "abort":
            for s in list(engine.running) + list(engine.waiting):
                engine.abort(s)
                s.out.put_nowait(None)
        engine.set_paused(True)
        return Response(status_code=200)

    @app.post("/resume")
    async def resume() -> Response:
        engine.set_paused(False)
        return Response(status_code=200)

    @app.get("/is_paused")
    async def is_paused() -> JSONResponse:
        return JSONResponse({"is_paused": engine.paused})

    return app


async def _collect(seq: Sequence, piece: Any) -> str:
    parts = []
    while (n := await seq.out.get()) is not None:
        parts.append(piece(n))
    return "".join(parts)


def render_metrics(engine: EmulatedEngine, model: str) -> str:
    lab = f'model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} {len(engine.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lab}}} {len(engine.waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{lab}}} {engine.kv_usage:.6f}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemptions.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{lab}}} {engine.preemptions}",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{lab}}} {engine.prompt_tokens_total}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lab}}} {engine.generation_tokens_total}",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{engine.block_size}",num_gpu_blocks="{engine.num_blocks}"}} 1',
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    cum = 0
    for le, n in zip((*TTFT_BUCKETS, math.inf), engine.ttft_counts, strict=True):
        cum += n
        le_s = "+Inf" if le == math.inf else repr(le)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le_s}"}} {cum}')
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{lab}}} {engine.ttft_sum:.6f}")
    lines.append(f"vllm:time_to_first_token_seconds_count{{{lab}}} {cum}")
    return "\n".join(lines) + "\n"
