"""`create_backend_app`: an OpenAI-compatible emulated inference server over one `EmulatedEngine`.

Routes: ``/v1/models`` (``created``, ``max_model_len``), ``/v1/completions``, ``/v1/chat/completions``,
``/v1/embeddings``, ``/tokenize`` (vLLM's shape: ``{model, prompt}`` or ``{model, messages,
add_generation_prompt}`` -> ``{count, max_model_len, tokens, token_strs}``), ``/health``, ``/metrics``
(vLLM names: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``,
``vllm:time_to_first_token_seconds``, ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:cache_config_info``) and vLLM's sleep/pause endpoints:
``POST /sleep?level=1|2``, ``POST /wake_up``, ``GET /is_sleeping``, ``POST /pause``, ``POST /resume``,
``GET /is_paused``. No module-level state.
Sleep level 1 takes the time of copying the weights to host memory and waking the time of copying
them back, at `SLEEP_L1_BYTES_S` (the ~21 GiB/s host copy measured for vLLM sleep level 1, the
figure `gpupool sim tidal` uses), scaled by the engine's ``speed``; ``on_memory(asleep)`` (optional)
is called when the engine's device memory goes (asleep) or comes back, so a simulated device can
show it (`gpupool emulate-backend --hold-vram-mib`).

OpenAI semantics honoured: ``n`` choices (index = prompt * n + sample), list prompts, ``stop`` (text cut
before the stop string, ``finish_reason: stop``), ``finish_reason: length`` at ``max_tokens`` (default
16 on the completions route, as vLLM; a chat request without ``max_tokens`` has no cap in vLLM, so the
emulated model ends its answer by itself after 16 tokens: ``finish_reason: stop``), streaming with
``delta.role`` on the first chunk, ``finish_reason`` on each choice's last content chunk and, with
``stream_options.include_usage``, a final ``choices: []`` usage chunk; embeddings as floats or
``encoding_format: base64`` (little-endian float32), ``dimensions`` <= the model's width. A request
whose client hangs up is aborted, streamed or not (vLLM cancels it too): its sequences leave the engine
and free their KV blocks.
Prefix caching: a prompt's token ids are hashed per 512-token chunk (`kvcache.chunk_keys`), so text
whose chunks agree hits the same cached blocks; an explicit ``kv_hash_ids`` list of integers (one per
512-token chunk, a Mooncake trace's ``hash_ids``) replaces the hashing. Metrics add vLLM's
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (GPU, tokens),
``vllm:external_prefix_cache_queries_total`` / ``..._hits_total`` (the host tier, tokens) and
``vllm:prompt_tokens_by_source_total``, plus ``gpupool:kv_host_tier_usage_perc`` and host-tier
traffic (``gpupool:kv_host_tier_loaded_bytes_total``, ``..._stored_bytes_total``).
Rejected with 400 in OpenAI's error shape: a prompt + ``max_tokens`` over ``max_model_len`` or over
what the KV block pool can ever hold (it would wait forever), a chat or
completion call to an embedding model (``task="embed"``) and the reverse, a non-zero ``priority`` unless
``scheduling_policy="priority"`` (vLLM's ``--scheduling-policy``; lower = more urgent), missing
``messages``/``prompt``/``input``. Token counts come from `EmulatedTokenizer` (not characters / 4).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from gpupool.adapters.backends.engine import TTFT_BUCKETS, EmulatedEngine
from gpupool.adapters.backends.kvcache import chunk_keys, chunk_keys_of_ids
from gpupool.adapters.backends.tokenizer import EmulatedTokenizer

TASKS = ("generate", "embed")
SLEEP_L1_BYTES_S = 64.0 / 3.0 * 1024**3
"""Weights copied to or from pinned host memory per second (vLLM sleep level 1: 64 GiB in ~3 s)."""
SCHEDULING_POLICIES = ("fcfs", "priority")
DEFAULT_MAX_TOKENS = 16
"""Completions without ``max_tokens`` stop here (``length``); an uncapped chat answer ends here (``stop``)."""


class BadRequest(Exception):
    def __init__(
        self, msg: str, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(msg)
        self.msg, self.param, self.code, self.status = msg, param, code, status


def _embedding(text: str, dim: int) -> list[float]:
    out: list[float] = []
    i = 0
    while len(out) < dim:
        h = hashlib.sha256(f"{i}:{text}".encode("utf-8", "surrogatepass")).digest()
        out.extend((v / 2**31) - 1.0 for v in struct.unpack("<8I", h))
        i += 1
    return out[:dim]


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name)
    if v is None:
        return default
    if type(v) is not int or not lo <= v <= hi:
        raise BadRequest(f"{name} must be an integer in [{lo}, {hi}], got {json.dumps(v)[:40]}", name)
    return v


def _prompts(x: Any, name: str) -> list[Any]:
    """A prompt/input field as a list of items (str or list of token ids); raises on a bad shape."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, list) and x:
        if all(type(t) is int for t in x):
            return [x]
        if all(isinstance(t, str) or (isinstance(t, list) and all(type(i) is int for i in t)) for t in x):
            return list(x)
    if x is None:
        raise BadRequest(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
    raise BadRequest(f"{name} must be a string, a list of strings or of token ids", name)


def _stops(body: dict[str, Any]) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        return [s] if s else []
    if isinstance(s, list) and all(isinstance(x, str) for x in s):
        return [x for x in s if x]
    raise BadRequest("stop must be a string or a list of strings", "stop")


def create_backend_app(
    engine: EmulatedEngine,
    *,
    model: str,
    embedding_dim: int = 64,
    task: str = "generate",
    max_model_len: int = 32768,
    scheduling_policy: str = "fcfs",
    on_memory: Callable[[bool], None] | None = None,
) -> FastAPI:
    if task not in TASKS:
        raise ValueError(f"task {task!r}: expected one of {', '.join(TASKS)}")
    if scheduling_policy not in SCHEDULING_POLICIES:
        raise ValueError(f"scheduling_policy {scheduling_policy!r}: expected fcfs or priority")
    tok = EmulatedTokenizer()
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title=f"gpupool emulated backend ({model})", lifespan=lifespan)

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return bad(exc.msg, exc.status, param=exc.param, code=exc.code)

    def bad(
        msg: str, status: int = 400, *, param: str | None = None, code: str | None = None
    ) -> JSONResponse:
        typ = "invalid_request_error" if status < 500 else "server_error"
        return JSONResponse(
            {"error": {"message": msg, "type": typ, "param": param, "code": code}}, status_code=status
        )

    async def parse(request: Request, want: str) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):
            raise BadRequest("body must be JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        if body.get("model", model) != model:
            raise BadRequest(
                f"The model `{body.get('model')}` does not exist.", "model", "model_not_found", 404
            )
        if want != task:
            api = "Embeddings" if want == "embed" else "Completions / Chat Completions"
            raise BadRequest(f"The model `{model}` does not support the {api} API (task {task}).", "model")
        return body

    def prio(body: dict[str, Any]) -> int:
        p = body.get("priority", 0)
        if type(p) is not int:
            raise BadRequest("priority must be an integer", "priority")
        if p != 0 and scheduling_policy != "priority":
            raise BadRequest(
                f"Got priority {p} but Priority scheduling is not enabled.",
                "priority",
                "priority_not_enabled",
            )
        return p

    def check_context(prompt: int, out: int, what: str) -> None:
        if prompt + out > max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{prompt + out} tokens ({prompt} in the {what}, {out} in the completion). Please reduce "
                f"the length of the {what} or completion.",
                what,
                "context_length_exceeded",
            )

    def check_capacity(prompt: int, out: int, what: str) -> None:
        if prompt + out > engine.capacity_tokens:
            raise BadRequest(
                f"This request needs {prompt + out} tokens of KV cache ({prompt} in the {what}, {out} in "
                f"the completion) but the instance's KV cache holds at most {engine.capacity_tokens}.",
                what,
                "context_length_exceeded",
            )

    def count_prompt(item: Any) -> int:
        return len(item) if isinstance(item, list) else tok.count(item)

    def prompt_ids(item: Any) -> list[int]:
        return list(item) if isinstance(item, list) else tok.encode(item)

    def explicit_keys(body: dict[str, Any], tokens: int) -> tuple[int, ...] | None:
        ids = body.get("kv_hash_ids")
        if ids is None:
            return None
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise BadRequest(
                f"kv_hash_ids must be a list of integers, got {json.dumps(ids)[:40]}", "kv_hash_ids"
            )
        return chunk_keys_of_ids(ids, tokens // engine.prefix_block_tokens)

    async def generate(body: dict[str, Any], request: Request, *, chat: bool) -> Response:
        if chat:
            msgs = body.get("messages")
            if msgs is None:
                raise BadRequest(
                    "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
                )
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
                raise BadRequest("messages must be a non-empty list of objects", "messages")
            idss = [tok.encode_chat(msgs)]
        else:
            idss = [prompt_ids(p) for p in _prompts(body.get("prompt"), "prompt")]
        counts = [len(ids) for ids in idss]
        grain = engine.prefix_block_tokens
        keys = [explicit_keys(body, c) or chunk_keys(ids, grain) for c, ids in zip(counts, idss, strict=True)]
        n = _int(body, "n", 1, 1, 128)
        mt = _int(body, "max_tokens", -1, 1, 1 << 24)
        mct = _int(body, "max_completion_tokens", -1, 1, 1 << 24)
        capped = mt > 0 or mct > 0 or not chat
        if mct > 0 and (mt < 0 or chat):  # vLLM's chat route: max_completion_tokens or max_tokens
            mt = mct
        elif mt < 0:
            mt = DEFAULT_MAX_TOKENS
        at_end = "length" if capped else "stop"  # uncapped chat: the model's own end of answer
        stops = _stops(body)
        p = prio(body)
        stream = body.get("stream") is True
        so = body.get("stream_options")
        if so is not None and (not stream or not isinstance(so, dict)):
            raise BadRequest("stream_options is only allowed when stream is true", "stream_options")
        include_usage = bool(so and so.get("include_usage"))
        for c in counts:
            check_context(c, mt, "messages" if chat else "prompt")
            check_capacity(c, mt, "messages" if chat else "prompt")
        seqs = [engine.submit(c, mt, p, keys=k) for c, k in zip(counts, keys, strict=True) for _ in range(n)]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        prompt_total = sum(counts)

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            d: dict[str, Any] = {
                "id": rid,
                "object": obj + ".chunk" if chat else obj,
                "created": created_at,
                "model": model,
                "choices": choices,
            }
            if include_usage:
                d["usage"] = usage
            return f"data: {json.dumps(d)}\n\n".encode()

        created_at = int(time.time())
        texts = [""] * len(seqs)
        reasons: list[str | None] = [None] * len(seqs)
        used = [0] * len(seqs)  # tokens taken into each choice (the engine may have run ahead)

        def step(i: int, tokn: int | None) -> str | None:
            """Append token ``tokn`` (None = sequence done) to choice i; return the new text piece."""
            if tokn is None:
                reasons[i] = at_end
                return None
            piece = "".join(f" tok{k}" for k in range(used[i] + 1, tokn + 1))  # several: stream_interval
            used[i] = tokn
            new = texts[i] + piece
            for s in stops:
                cut = new.find(s)
                if cut >= 0:
                    # a stop that began in text already streamed ends the choice there (no retraction)
                    cut = max(cut, len(texts[i]))
                    reasons[i] = "stop"
                    piece = new[len(texts[i]) : cut]
                    texts[i] = new[:cut]
                    engine.abort(seqs[i])
                    return piece
            texts[i] = new
            if tokn >= seqs[i].max_tokens:
                reasons[i] = at_end
            return piece

        def usage() -> dict[str, int]:
            done = sum(used)
            return {
                "prompt_tokens": prompt_total,
                "completion_tokens": done,
                "total_tokens": prompt_total + done,
            }

        if stream:

            async def events() -> AsyncIterator[bytes]:
                try:
                    if chat:
                        yield chunk(
                            [
                                {
                                    "index": i,
                                    "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None,
                                }
                                for i in range(len(seqs))
                            ]
                        )
                    live = set(range(len(seqs)))
                    while live:
                        for i in sorted(live):
                            piece = step(i, await seqs[i].out.get())
                            if reasons[i] is not None:
                                live.discard(i)
                            yield chunk([_choice(chat, i, piece or "", reasons[i])])
                    if include_usage:
                        yield chunk([], usage())
                    yield b"data: [DONE]\n\n"
                finally:
                    for s in seqs:
                        engine.abort(s)

            return StreamingResponse(events(), media_type="text/event-stream")

        async def collect() -> None:
            for i, s in enumerate(seqs):
                while reasons[i] is None:
                    step(i, await s.out.get())

        work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(_disconnected(request))
        try:  # like vLLM, a client that hangs up cancels its request (no tokens for nobody)
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            work.cancel()
            gone.cancel()
            for s in seqs:
                engine.abort(s)
        if not work.done() or work.cancelled():
            return Response(status_code=499)  # (nobody reads it: the client is gone)
        work.result()  # (raises what the generation raised)
        choices = [
            (
                {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": reasons[i]}
                if chat
                else {"index": i, "text": t, "finish_reason": reasons[i], "logprobs": None}
            )
            for i, t in enumerate(texts)
        ]
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": created_at,
                "model": model,
                "choices": choices,
                "usage": usage(),
            }
        )

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)  # (monitors, curl -I)

    def card() -> dict[str, Any]:
        return {
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "gpupool-emulator",
            "root": model,
            "max_model_len": max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card()]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(await parse(request, "generate"), request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(await parse(request, "generate"), request, chat=True)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):
            raise BadRequest("body must be JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        if "messages" in body:
            msgs = body["messages"]
            if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
                raise BadRequest("messages must be a list of objects", "messages")
            ids = tok.encode_chat(
                msgs, add_generation_prompt=body.get("add_generation_prompt", True) is not False
            )
        elif isinstance(body.get("prompt"), str):
            ids = tok.encode(
                body["prompt"], add_special_tokens=body.get("add_special_tokens", True) is not False
            )
        else:
            raise BadRequest("prompt must be a string (or give messages)", "prompt")
        return JSONResponse(
            {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}
        )

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await parse(request, "embed")
        items = _prompts(body.get("input"), "input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest(
                f"encoding_format must be float or base64, got {json.dumps(fmt)[:40]}", "encoding_format"
            )
        dim = _int(body, "dimensions", embedding_dim, 1, embedding_dim)
        counts = [count_prompt(x) for x in items]
        for c in counts:
            check_context(c, 0, "input")
        seq = engine.submit(sum(counts), 0, prio(body))
        try:
            while await seq.out.get() is not None:
                pass
        finally:
            engine.abort(seq)
        data = []
        for i, x in enumerate(items):
            vec = _embedding(json.dumps(x) if isinstance(x, list) else x, embedding_dim)[:dim]
            emb: list[float] | str = (
                base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode() if fmt == "base64" else vec
            )
            data.append({"object": "embedding", "index": i, "embedding": emb})
        total = sum(counts)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": total, "total_tokens": total},
            }
        )

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(engine, model), media_type="text/plain; version=0.0.4")

    app.add_api_route("/metrics", metrics, methods=["HEAD"], include_in_schema=False)  # (monitors, curl -I)

    roof = engine.roofline
    copy_s = roof.params * roof.bytes_per_param / SLEEP_L1_BYTES_S / engine.speed

    @app.post("/sleep")
    async def sleep(level: int = 1, mode: str = "abort") -> Response:
        if level not in (1, 2):
            return bad("level must be 1 or 2")
        if mode not in ("keep", "wait", "abort"):
            return bad("mode must be keep, wait or abort")
        if engine.sleep_level:
            return Response(status_code=200)
        engine.sleep(level)
        if level == 1:
            await asyncio.sleep(copy_s)  # weights to host memory
        if on_memory is not None:
            on_memory(True)
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up() -> Response:
        if not engine.sleep_level:
            return Response(status_code=200)
        if on_memory is not None:
            on_memory(False)
        await asyncio.sleep(copy_s)  # weights back (level 2: reloaded; modelled at the same rate)
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


async def _disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body was read) has hung up."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _choice(chat: bool, i: int, piece: str, reason: str | None) -> dict[str, Any]:
    if chat:
        return {"index": i, "delta": {"content": piece} if piece else {}, "finish_reason": reason}
    return {"index": i, "text": piece, "finish_reason": reason, "logprobs": None}


def render_metrics(engine: EmulatedEngine, model: str) -> str:
    lab = f'model_name="{model}"'
    by_source = "vllm:prompt_tokens_by_source_total"
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
        "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{lab}}} {engine.prefix_queries_tokens}",
        "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{lab}}} {engine.prefix_hits_tokens}",
        "# HELP vllm:external_prefix_cache_queries External (host-tier) prefix cache queries, in tokens.",
        "# TYPE vllm:external_prefix_cache_queries counter",
        f"vllm:external_prefix_cache_queries_total{{{lab}}} {engine.host_queries_tokens}",
        "# HELP vllm:external_prefix_cache_hits External (host-tier) prefix cache hits, in tokens.",
        "# TYPE vllm:external_prefix_cache_hits counter",
        f"vllm:external_prefix_cache_hits_total{{{lab}}} {engine.host_hits_tokens}",
        "# HELP vllm:prompt_tokens_by_source Prompt tokens by where their KV came from.",
        "# TYPE vllm:prompt_tokens_by_source counter",
        f'{by_source}{{{lab},source="local_compute"}} {engine.recomputed_tokens}',
        f'{by_source}{{{lab},source="local_cache_hit"}} {engine.prefix_hits_tokens}',
        f'{by_source}{{{lab},source="external_kv_transfer"}} {engine.host_hits_tokens}',
        "# HELP gpupool:kv_host_tier_usage_perc Host-tier KV usage. 1 means 100 percent usage.",
        "# TYPE gpupool:kv_host_tier_usage_perc gauge",
        f"gpupool:kv_host_tier_usage_perc{{{lab}}} {engine.host_tier_usage:.6f}",
        "# TYPE gpupool:kv_host_tier_loaded_bytes counter",
        f"gpupool:kv_host_tier_loaded_bytes_total{{{lab}}} {engine.host_loaded_bytes}",
        "# TYPE gpupool:kv_host_tier_stored_bytes counter",
        f"gpupool:kv_host_tier_stored_bytes_total{{{lab}}} {engine.host_stored_bytes}",
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
