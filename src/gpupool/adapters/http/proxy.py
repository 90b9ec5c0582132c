"""OpenAI-compatible proxy: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``; streaming (SSE) passed through chunk by chunk.

Each request takes a short *request lease* on one backend's KV-cache budget, sized by the KV estimator
from the prompt's token estimate (characters / 4) + ``max_tokens`` (default 256; 0 for embeddings),
and releases it when the response completes or the client disconnects (the stream's ``finally``).
Priority comes from ``x-gpupool-priority`` or ``x-gateway-inference-objective`` (P0|P1|P2|int; default
P1), the tenant from the bearer token. The gateway's priority (higher = more urgent) is forwarded in
the body as vLLM's ``priority`` (lower = more urgent) via `to_vllm_priority`.

Statuses: 401 without a token, 400 for a body that is not a JSON object with a ``model``, 503 when no
backend serves the model, 429 + Retry-After when admission holds the request back (queue deadline,
band full, watermark backpressure), the backend's own status otherwise (502 if it cannot be reached).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.model import Request as CoreRequest
from gpupool.core.outcome import OutcomeCode
from gpupool.core.priority import P1, parse_priority, to_vllm_priority
from gpupool.hardware.units import Resources

if TYPE_CHECKING:
    from gpupool.adapters.http.app import Gateway

PRIORITY_HEADERS = ("x-gpupool-priority", "x-gateway-inference-objective")
PROXY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
CHARS_PER_TOKEN = 4


def estimate_prompt_tokens(body: dict[str, Any], path: str) -> int:
    """Characters / 4 over the text the backend will read (a deliberate, documented over-estimate)."""
    chars = 0

    def add(x: Any) -> None:
        nonlocal chars
        if isinstance(x, str):
            chars += len(x)
        elif isinstance(x, list):
            for y in x:
                add(y)
        elif isinstance(x, dict):
            add(x.get("content", x.get("text", "")))
        elif isinstance(x, int):
            chars += CHARS_PER_TOKEN  # a token id

    if path.endswith("chat/completions"):
        add(body.get("messages", []))
    elif path.endswith("embeddings"):
        add(body.get("input", ""))
    else:
        add(body.get("prompt", ""))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def add_proxy_routes(
    app: FastAPI, gw: Gateway, *, timeout_s: float = 300.0, inject_priority: bool = True
) -> None:
    from gpupool.adapters.http.app import current_principal as auth

    c = gw.controller
    from gpupool.adapters.http.upstream import UpstreamPool

    pool = UpstreamPool(timeout_s=timeout_s)

    async def close() -> None:
        await pool.aclose()

    gw.closers.append(close)

    def err(status: int, msg: str, code: str, retry: float | None = None) -> JSONResponse:
        headers = {}
        if retry is not None:
            headers["Retry-After"] = str(max(1, round(retry)))
            headers["x-gpupool-dropped-reason"] = code
        return JSONResponse(
            {"error": {"message": msg, "type": code, "code": code}}, status_code=status, headers=headers
        )

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        await auth(request)
        data = [
            {"id": m, "object": "model", "owned_by": "gpupool", "backends": len(bs)}
            for m, bs in c.models().items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def forward(request: Request, path: str) -> Response:
        who = await auth(request)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return err(400, "body must be a JSON object", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return err(400, "body must be a JSON object with a string 'model'", "invalid_request_error")
        model = body["model"]
        if model not in c.models():
            return err(503, f"no backend serves model {model!r}", "model_not_available")
        prio_raw = next((request.headers[h] for h in PRIORITY_HEADERS if h in request.headers), None)
        try:
            prio = P1 if prio_raw is None else parse_priority(prio_raw, field="x-gpupool-priority")
        except InvalidInput as exc:
            return err(400, str(exc), "invalid_request_error")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if path.endswith("embeddings"):
            out_tokens = 0
        elif (
            isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and 0 < max_tokens <= 10_000_000
        ):
            out_tokens = max_tokens
        else:
            out_tokens = gw.default_max_tokens
        tokens = estimate_prompt_tokens(body, path) + out_tokens
        try:
            mib = gw.sizer.request_mib(model, tokens) if gw.sizer is not None else max(1, tokens // 8)
        except ValueError as exc:
            return err(400, f"cannot size a request for model {model!r}: {exc}", "invalid_request_error")
        req = CoreRequest(
            id=os.urandom(16).hex(),  # a request id; uuid4's str() costs several times more
            tenant=who.tenant,
            priority=prio,
            demand=Resources(mib, 0),
            ttl_s=timeout_s + 30.0,
            model=model,
        )
        t0 = time.perf_counter()
        try:
            out = c.acquire(req)
        except InvalidInput as exc:
            return err(400, str(exc), "invalid_request_error")
        lease = out.lease
        if out.code is OutcomeCode.QUEUED and out.ticket:
            st = c.ticket(out.ticket)
            if st.state == "queued":
                await gw.hub.wait_ticket(out.ticket, max(0.0, st.deadline_at - c.clock.now()) + 0.05)
                st = c.ticket(out.ticket)
                if st.state == "queued":
                    c.cancel(out.ticket)
            lease = st.lease if st.state == "granted" else None
            if lease is None:
                return err(429, st.reason or "queue deadline passed", "shed", retry=c.config.retry_after_s)
        elif not out.granted:
            status = 503 if out.code is OutcomeCode.UNRESOLVABLE else 429
            return err(status, out.reason, out.code.value, retry=out.retry_after_s if status == 429 else None)
        assert lease is not None
        backend = c.backend_of(lease)
        lease_id = lease.id

        def release() -> None:
            with contextlib.suppress(UnknownId):
                c.release(lease_id, reason="request finished")

        if backend is None:
            release()
            return err(503, f"no backend for model {model!r}", "model_not_available")
        if inject_priority:
            body["priority"] = to_vllm_priority(prio)
            raw = json.dumps(body, separators=(",", ":")).encode()
        headers = {
            "content-type": "application/json",
            "x-gpupool-lease": lease_id,
            "x-gpupool-tenant": who.tenant,
        }
        url = backend.url.rstrip("/") + path
        stream = bool(body.get("stream"))
        try:
            upstream = await pool.request("POST", url, content=raw, headers=headers)
        except Exception as exc:
            release()
            if gw.metrics is not None:
                gw.metrics.observe_proxy(model, 502, None, time.perf_counter() - t0)
            return err(502, f"backend {backend.id} unreachable: {type(exc).__name__}", "bad_gateway")
        out_headers = {"x-gpupool-lease": lease_id, "x-gpupool-backend": backend.id}
        if not stream:
            try:
                content = await upstream.read()
            except Exception as exc:
                release()
                return err(
                    502, f"backend {backend.id} failed mid-response: {type(exc).__name__}", "bad_gateway"
                )
            release()
            if gw.metrics is not None:
                dt = time.perf_counter() - t0
                gw.metrics.observe_proxy(model, upstream.status_code, dt, dt)
            return Response(
                content,
                status_code=upstream.status_code,
                media_type=upstream.headers.get("content-type", "application/json"),
                headers=out_headers,
            )

        async def relay() -> AsyncIterator[bytes]:
            first: float | None = None
            try:
                async for chunk in upstream.aiter_raw():
                    if first is None:
                        first = time.perf_counter() - t0
                    yield chunk
            finally:
                await upstream.aclose()
                release()
                if gw.metrics is not None:
                    gw.metrics.observe_proxy(model, upstream.status_code, first, time.perf_counter() - t0)

        return StreamingResponse(
            relay(),
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type", "text/event-stream"),
            headers=out_headers,
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await forward(request, "/v1/embeddings")

    app.add_middleware(ProxyFastPath, forward=forward, paths=PROXY_PATHS)


class ProxyFastPath:
    """Pure ASGI middleware: ``POST`` on the proxy paths goes straight to ``forward`` (same handler,
    same responses, the app's own exception handlers), skipping FastAPI's routing, dependency
    solving and exception middleware; everything else passes through untouched. The FastAPI routes
    stay registered (OpenAPI, other methods). Measured (proxy-peers bench): the framework layers
    skipped here were the larger part of the proxy's per-request CPU."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        forward: Callable[[Request, str], Awaitable[Response]],
        paths: frozenset[str],
    ) -> None:
        self.app, self.forward, self.paths = app, forward, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in self.paths:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self.forward(request, path)
        except Exception as exc:
            handlers = request.app.exception_handlers
            handler = next((handlers[t] for t in type(exc).__mro__ if t in handlers), None)
            if handler is None:
                raise
            out = handler(request, exc)
            response = await out if inspect.isawaitable(out) else out
        await response(scope, receive, send)
