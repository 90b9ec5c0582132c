"""OpenAI-compatible proxy: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, ``/v1/models/{id}``; streaming (SSE) passed through chunk by chunk, unchanged.

Each request takes a short *request lease* on one backend's KV-cache budget, sized by the KV estimator
from the prompt's token count + ``n`` x ``max_tokens`` per prompt (default 256, capped by the context;
0 for embeddings), and releases it exactly once when the response completes, fails, or the client
goes: a stream's body is a `Relay` (its clean-up runs even when it is closed before its first
chunk), and a request cancelled while it waits on the backend (the native path cancels it when
its client hangs up) releases its lease and closes the backend connection, so the engine aborts.
The prompt count is the corrected estimate of `openai_request` (characters / 4, fitted per model
to earlier responses' ``usage.prompt_tokens``); when it comes within ``NEAR_CONTEXT`` of the
model's context the backend's ``/tokenize`` (vLLM's) gives the exact count, and only an exact count
over the context is rejected here. Bodies are decoded depth-bounded (`jsonbody`).

Priority: ``x-gpupool-priority`` (P0|P1|P2|int), else the ``x-gateway-inference-objective`` name
looked up in the objective table (`set_objectives`; defaults interactive/retrieval/batch = P0/P1/P2),
else P1; the tenant from the bearer token. vLLM's ``priority`` (lower = more urgent, via
`to_vllm_priority`) is written into the body only for backends declared with priority scheduling
(`configure_backend`): vLLM rejects non-zero priorities otherwise. Per-model facts (task generate |
embed, ``max_model_len``) come from `configure_model` or the hardware catalogue.

Sessions: a request with a session id (``x-gpupool-session``, else ``user`` / ``prompt_cache_key``)
and every request of a model with several backends goes to the cheapest backend among those it keeps
below their red line: prompt tokens already waiting there for a first token + a weighted count of
the tokens the session's prefix there does not cover (`core.sessions.SessionTable.route`); if it must
queue, a session's turn waits for room on the backend holding its prefix first, for as long as the
recompute it saves would take at the prefill rate measured from streamed first tokens
(`SessionTable.holder`); when a turn ends its backend keeps the prefix as a retained lease.
Queueing: a request that finds no room waits in the admission queue for its band's default time,
or ``x-gpupool-queue-timeout`` seconds (``0``: never queue, 429 at once); past it, 429.
Truncation (opt-in, chat only): ``x-gpupool-truncate: oldest-turns`` drops the oldest turns of a
request over the context instead of the 400 (`truncate`), saying so in ``x-gpupool-truncated``.

Errors, all in OpenAI's shape ``{"error": {message, type, param, code}}`` so the SDK raises the right
class: 401 missing/invalid token, 400 bad body / field / task / context or a KV cache over every
instance's budget, 404 unknown model, 429 + Retry-After when admission holds it back (queue deadline,
band full, watermarks), 503 when no healthy backend can hold it, else the backend's status (502: down).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from gpupool.adapters.http.errors import clip, handled, unsupported_encoding
from gpupool.adapters.http.jsonbody import JsonBodyError, loads_bounded
from gpupool.adapters.http.openai_request import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    OpenAIError,
    inspect,
    model_of,
    priority_of,
    usage_prompt_tokens,
)
from gpupool.adapters.http.proxylimits import (
    NEAR_CONTEXT,
    QUEUE_TIMEOUT_HEADER,
    TOKENIZE_TIMEOUT_S,
    over_budget,
    queue_timeout,
    tokenize_body,
    too_long,
)
from gpupool.adapters.http.relay import Relay
from gpupool.adapters.http.surface import OpenAISurface
from gpupool.adapters.http.truncate import TRUNCATE_HEADER, TRUNCATED_HEADER, drop_oldest_turns, truncate_mode
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.ids import random_bytes16
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.model import Request as CoreRequest
from gpupool.core.outcome import OutcomeCode
from gpupool.core.priority import to_vllm_priority
from gpupool.core.sessions import session_of
from gpupool.hardware.units import Resources

if TYPE_CHECKING:
    from gpupool.adapters.http.auth import Principal
    from gpupool.adapters.http.proxyhost import ProxyHost


class Incoming(Protocol):
    """What `forward` reads of a request: a Starlette ``Request`` or the fast path's `_FastRequest`."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def body(self) -> bytes: ...


class _FastRequest:
    """The fast path's request: headers decoded once into a dict (first value of a repeated name
    wins, as with Starlette's ``Headers.get``), the body read straight from ``receive``."""

    __slots__ = ("_receive", "headers")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        h: dict[str, str] = {}
        for k, v in scope["headers"]:
            name = k.decode("latin-1")
            if name not in h:
                h[name] = v.decode("latin-1")
        self.headers = h
        self._receive = receive

    async def body(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            msg = await self._receive()
            if msg["type"] == "http.request":
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif msg["type"] == "http.disconnect":
                raise ClientDisconnect()


class RawResponse(Response):
    """A complete response whose header list is built by the caller (no ``init_headers`` pass);
    sent like any Starlette ``Response``."""

    def __init__(self, body: bytes, status_code: int, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.body, self.status_code, self.raw_headers = body, status_code, raw_headers
        self.background = None


def _media(ct: str) -> bytes:
    """Starlette's rule for a ``media_type``: text types get a charset when they lack one."""
    if ct.startswith("text/") and "charset=" not in ct.lower():
        ct += "; charset=utf-8"
    return ct.encode("latin-1")


def _err(exc: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def add_proxy_routes(
    app: FastAPI,
    gw: ProxyHost,
    *,
    timeout_s: float = 300.0,
    inject_priority: bool = True,
) -> None:
    """``inject_priority=False`` never writes ``priority`` into bodies, whatever the backend options.
    A session's turn goes to the instance holding its prefix unless that would take the instance's
    predicted KV use over its red line (`gpupool.core.sessions`, ``kv_red_line_pct``).
    ``gw``: the gateway, or a proxy replica's host (`proxyhost`: all the proxy reads of either)."""
    c = gw.controller
    sessions = c.sessions
    app.state.sessions = sessions
    from gpupool.adapters.http.upstream import UpstreamPool

    pool = UpstreamPool(timeout_s=timeout_s)
    urls: dict[tuple[str, str], str] = {}
    """(backend url, path) -> the upstream URL (a few backends; emptied past 1,024)."""
    medias: dict[str, bytes] = {}

    def media(ct: str) -> bytes:
        m = medias.get(ct)
        if m is None:
            if len(medias) >= 256:
                medias.clear()
            m = medias[ct] = _media(ct)
        return m

    surf = OpenAISurface()
    app.state.openai = surf

    async def close() -> None:
        await pool.aclose()

    gw.closers.append(close)

    def err(status: int, msg: str, code: str, retry: float | None = None) -> JSONResponse:
        headers = {}
        if retry is not None:
            headers["Retry-After"] = str(max(1, round(retry)))
            headers["x-gpupool-dropped-reason"] = code
        typ = "requests" if status == 429 else ""
        return _err(OpenAIError(status, msg, code=code, typ=typ), headers)

    def principal(request: Incoming) -> Principal | JSONResponse:
        h = request.headers.get("authorization", "")
        who = gw.tokens.lookup(h[7:].strip()) if h[:7].lower() == "bearer " else None
        if who is not None:
            return who
        msg = (
            "Incorrect API key provided."
            if h
            else "You didn't provide an API key. Send it as 'Authorization: Bearer <token>'."
        )
        return _err(OpenAIError(401, msg, code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})

    def model_entry(m: str, n: int) -> dict[str, Any]:
        card = surf.card(m, c.clock.now())
        d: dict[str, Any] = {"id": m, "object": "model", "created": card.created, "owned_by": "gpupool"}
        d["backends"] = n
        if card.max_model_len is not None:
            d["max_model_len"] = card.max_model_len
        return d

    def not_found(model: str) -> JSONResponse:
        return _err(
            OpenAIError(
                404,
                f"The model `{clip(model)}` does not exist or no backend serves it.",
                param="model",
                code="model_not_found",
            )
        )

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        who = principal(request)
        if isinstance(who, Response):
            return who
        data = [model_entry(m, len(bs)) for m, bs in c.models().items()]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        who = principal(request)
        if isinstance(who, Response):
            return who
        bs = c.models().get(model_id)
        return not_found(model_id) if not bs else JSONResponse(model_entry(model_id, len(bs)))

    async def exact_prompt_tokens(url: str, model: str, body: dict[str, Any], kind: str) -> int | None:
        """The backend's ``/tokenize`` count, or None when it cannot say (no such route, error)."""
        doc = tokenize_body(model, body, kind)
        if doc is None:
            return None
        surf.tokenize_calls += 1

        async def ask() -> Any:
            r = await pool.request(
                "POST",
                url.rstrip("/") + "/tokenize",
                content=doc,
                headers={"content-type": "application/json"},
            )
            data = await r.read()
            return json.loads(data).get("count") if r.status_code == 200 else None

        try:
            count = await asyncio.wait_for(ask(), TOKENIZE_TIMEOUT_S)
        except Exception:
            return None
        return count if type(count) is int and count >= 0 else None

    def _give_back(ticket: str, sid: str) -> None:
        """A waiter that will not use its ticket: cancel it, or release what the pump granted it
        meanwhile (and end the session's pin there: the engine never saw this turn, so the view
        keeps no prefix of it there)."""
        st = c.ticket(ticket)
        if st.state == "queued":
            c.cancel(ticket)
            return
        lease = st.lease if st.state == "granted" else None
        if lease is None:
            return
        try:  # noqa: SIM105
            c.release(lease.id, reason="the client went away while queued")
        except UnknownId:
            pass
        kv_slice = lease.grants[0].slice_id if lease.grants else ""
        if sid and kv_slice:
            c.session_begin(sid, lease)
            c.session_end(sid, kv_slice, 0)

    async def forward(request: Incoming, path: str, kind: str) -> Response:
        who = principal(request)
        if isinstance(who, Response):
            return who
        enc = unsupported_encoding(request.headers.get("content-encoding"))
        if enc is not None:
            return _err(OpenAIError(415, enc, param="content-encoding", code="unsupported_content_encoding"))
        raw = await request.body()
        try:
            body = loads_bounded(raw)
        except JsonBodyError as exc:
            return _err(OpenAIError(400, str(exc), code="invalid_json"))
        if not isinstance(body, dict):
            return _err(OpenAIError(400, "body must be a JSON object", code="invalid_json"))
        try:
            model = model_of(body)
        except OpenAIError as exc:
            return _err(exc)
        backends = c.models().get(model)
        if not backends:
            return not_found(model)
        card = surf.models.get(model) or surf.card(model, c.clock.now())
        try:
            shape = inspect(body, kind)
            if card.task is not None and (card.task == "embed") != (kind == EMBEDDINGS):
                api = "Embeddings" if kind == EMBEDDINGS else "Chat Completions / Completions"
                raise OpenAIError(
                    400,
                    f"The model `{model}` ({card.task}) does not support the {api} API.",
                    param="model",
                    code="model_not_supported",
                )
            prio = priority_of(request.headers, surf.objectives)
            wait_s = queue_timeout(request.headers.get(QUEUE_TIMEOUT_HEADER), c.config.admission.max_wait_s)
            est = shape.prompt_estimate
            prompt = surf.correction.predict(model, est)
            ctx = card.max_model_len
            mt = shape.max_tokens or 0
            truncated = ""
            try:
                mode = truncate_mode(request.headers.get(TRUNCATE_HEADER))
            except ValueError as exc:
                raise OpenAIError(400, str(exc), param=TRUNCATE_HEADER, code="invalid_value") from None
            if mode and kind == CHAT and ctx is not None and prompt + mt > ctx and mt < ctx:
                limit, base = ctx, dict(body)

                def fits(msgs: list[Any]) -> bool:
                    guess = inspect({**base, "messages": msgs}, kind).prompt_estimate
                    return surf.correction.predict(model, guess) + mt <= limit

                cut = drop_oldest_turns(body["messages"], fits)
                if cut is None:
                    raise too_long(ctx, mt, prompt, kind)
                body["messages"] = cut[0]
                raw = json.dumps(body, separators=(",", ":")).encode()
                shape = inspect(body, kind)
                before, est = prompt, shape.prompt_estimate
                prompt = surf.correction.predict(model, est)
                truncated = f"turns={cut[1]}; tokens={before - prompt}"
            if ctx is not None:
                if mt >= ctx:
                    raise too_long(ctx, mt, None, kind, shape.max_tokens_param)
                if prompt + mt > NEAR_CONTEXT * ctx:
                    exact = await exact_prompt_tokens(backends[0].url, model, body, kind)
                    if exact is not None:
                        prompt = exact
                        if exact + mt > ctx:
                            raise too_long(ctx, mt, exact, kind)
        except OpenAIError as exc:
            return _err(exc)
        if kind == EMBEDDINGS:
            out_tokens = 0
        else:
            each = mt or (
                gw.default_max_tokens if ctx is None else max(1, min(gw.default_max_tokens, ctx - prompt))
            )
            out_tokens = each * shape.n * shape.prompts
        # a sequence never holds more KV than its context: an estimate over it (no /tokenize answer)
        # is sized at the context and forwarded, and the backend gives its 400
        tokens = (prompt if ctx is None else min(prompt, ctx)) + out_tokens
        try:
            mib = gw.sizer.request_mib(model, tokens) if gw.sizer is not None else max(1, tokens // 8)
        except ValueError as exc:
            return err(400, f"cannot size a request for model {model!r}: {exc}", "invalid_request_error")
        req = CoreRequest(
            id=random_bytes16().hex(),  # a request id; uuid4's str() costs several times more
            tenant=who.tenant,
            priority=prio,
            demand=Resources(mib, 0),
            ttl_s=timeout_s + 30.0,
            model=model,
        )
        t0 = time.perf_counter()
        sid = session_of(request.headers, body)
        prefer, fresh = "", prompt
        holder, fresh_there, patience_s = "", prompt, 0.0
        if len(backends) > 1:
            insts = [KV_PREFIX + b.id for b in backends]
            prefer, fresh = sessions.route(sid, mib, prompt, insts, c.kv_load)
            if sid:  # if it queues, it waits for room on its holder first
                holder, fresh_there, patience_s = sessions.holder(sid, prompt, mib)
                if holder not in insts:
                    holder, fresh_there, patience_s = "", prompt, 0.0
        try:
            if prefer or sid or wait_s:
                out = c.acquire(
                    req,
                    prefer=prefer,
                    session=sid,
                    wait_s=wait_s or None,
                    holder=holder,
                    patience_s=patience_s,
                )
            else:
                out = c.acquire(req)
        except InvalidInput as exc:
            return err(400, str(exc), "invalid_request_error")
        lease = out.lease
        if out.code is OutcomeCode.QUEUED and out.ticket:
            st = c.ticket(out.ticket)
            if st.state == "queued" and wait_s == 0:
                c.cancel(out.ticket)
                return err(429, "no room now and the request asked not to queue", "shed", retry=1.0)
            if st.state == "queued":
                try:
                    await gw.hub.wait_ticket(out.ticket, max(0.0, st.deadline_at - c.clock.now()) + 0.05)
                except BaseException:  # cancelled (a stream's client gone, the server stopping)
                    _give_back(out.ticket, sid)
                    raise
                st = c.ticket(out.ticket)
                if st.state == "queued":
                    c.cancel(out.ticket)
            lease = st.lease if st.state == "granted" else None
            if lease is None and st.state == "failed":  # it became unresolvable while it waited
                return err(503, st.reason or "no backend can hold this request", "unresolvable")
            if lease is None:
                return err(429, st.reason or "queue deadline passed", "shed", retry=c.config.retry_after_s)
        elif not out.granted:
            if out.code is OutcomeCode.UNRESOLVABLE and (most := max(map(c.kv_capacity_mib, backends))) < mib:
                return _err(over_budget(model, mib, most, shape, kind))  # the client's to change: 400
            status = 503 if out.code is OutcomeCode.UNRESOLVABLE else 429
            return err(status, out.reason, out.code.value, retry=out.retry_after_s if status == 429 else None)
        assert lease is not None
        backend = c.backend_of(lease)
        lease_id = lease.id
        kv_slice = lease.grants[0].slice_id if lease.grants else ""
        if sid and kv_slice:
            sessions.note_routed(sid, kv_slice)
            c.session_begin(sid, lease)
        # prompt tokens waiting for a first token there
        waiting = [fresh if kv_slice == prefer else fresh_there if kv_slice == holder else prompt]
        sessions.prefill_begin(kv_slice, waiting[0])
        granted_at = time.perf_counter()

        def first_token(measured: bool = False) -> None:
            if waiting[0]:
                elapsed = time.perf_counter() - granted_at if measured else 0.0
                sessions.prefill_done(kv_slice, waiting[0], elapsed)
                waiting[0] = 0

        released = [False]

        def release() -> None:  # idempotent: the stream's end, a failure and a cancel may all call it
            if released[0]:
                return
            released[0] = True
            first_token()
            try:  # noqa: SIM105 (contextlib.suppress costs three calls per request)
                c.release(lease_id, reason="request finished")
            except UnknownId:
                pass
            if sid and kv_slice:
                c.session_end(sid, kv_slice, mib)

        if backend is None:
            release()
            return err(503, f"no backend for model {model!r}", "model_not_available")
        opts = surf.backends.get(backend.id)
        if inject_priority and opts is not None and opts.priority_scheduling:
            body["priority"] = to_vllm_priority(prio)
            raw = json.dumps(body, separators=(",", ":")).encode()
        headers = {
            "content-type": "application/json",
            "x-gpupool-lease": lease_id,
            "x-gpupool-tenant": who.tenant,
        }
        url = urls.get((backend.url, path))
        if url is None:
            if len(urls) >= 1024:
                urls.clear()
            url = urls[(backend.url, path)] = backend.url.rstrip("/") + path
        try:
            upstream = await pool.request("POST", url, content=raw, headers=headers)
        except Exception as exc:
            release()
            if gw.metrics is not None:
                gw.metrics.observe_proxy(model, 502, None, time.perf_counter() - t0)
            return err(502, f"backend {backend.id} unreachable: {type(exc).__name__}", "bad_gateway")
        except BaseException:  # cancelled (the client went away, the server stops): give the lease back
            release()
            raise
        if not shape.stream:
            try:
                content = await upstream.read()
            except Exception as exc:
                release()
                if gw.metrics is not None:  # counted as the client sees it, as an unreachable backend is
                    gw.metrics.observe_proxy(model, 502, None, time.perf_counter() - t0)
                return err(
                    502, f"backend {backend.id} failed mid-response: {type(exc).__name__}", "bad_gateway"
                )
            except BaseException:  # cancelled: `read` closed the backend connection (it aborts there)
                release()
                raise
            release()
            if gw.metrics is not None:
                dt = time.perf_counter() - t0
                gw.metrics.observe_proxy(model, upstream.status_code, dt, dt)
            if upstream.status_code == 200 and (actual := usage_prompt_tokens(content)) is not None:
                surf.correction.observe(model, est, actual)
            raw_headers = [
                (b"x-gpupool-lease", lease_id.encode("latin-1")),
                (b"x-gpupool-backend", backend.id.encode("latin-1")),
                (b"content-length", str(len(content)).encode("latin-1")),
                (b"content-type", media(upstream.headers.get("content-type", "application/json"))),
            ]
            if truncated:
                raw_headers.append((TRUNCATED_HEADER.encode(), truncated.encode()))
            return RawResponse(content, upstream.status_code, raw_headers)

        first: list[float | None] = [None]

        def on_chunk(chunk: bytes) -> None:
            if first[0] is None:
                first[0] = time.perf_counter() - t0
                first_token(measured=True)
            if b'"prompt_tokens"' in chunk and (actual := usage_prompt_tokens(chunk)) is not None:
                surf.correction.observe(model, est, actual)

        def finish() -> None:
            release()
            if gw.metrics is not None:
                gw.metrics.observe_proxy(model, upstream.status_code, first[0], time.perf_counter() - t0)

        return StreamingResponse(
            Relay(upstream, on_chunk, finish),
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type", "text/event-stream"),
            headers={"x-gpupool-lease": lease_id, "x-gpupool-backend": backend.id}
            | ({TRUNCATED_HEADER: truncated} if truncated else {}),
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions", CHAT)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions", COMPLETIONS)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await forward(request, "/v1/embeddings", EMBEDDINGS)

    app.add_middleware(ProxyFastPath, forward=forward, paths=PROXY_PATHS)
    from gpupool.adapters.http.native import NativeProxy

    # the gateway's own HTTP protocol answers these below ASGI (`server`), with the same `forward`
    app.state.native_proxy = NativeProxy(app=app, forward=forward, paths=PROXY_PATHS)


PROXY_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS, "/v1/embeddings": EMBEDDINGS}
"""The proxy's POST paths and the request kind each one serves (`ProxyFastPath`)."""


class ProxyFastPath:
    """Pure ASGI middleware: ``POST`` on the proxy paths goes straight to ``forward`` (same handler,
    same responses, the app's own exception handlers), skipping FastAPI's routing, dependency
    solving and exception middleware; everything else passes through untouched. The FastAPI routes
    stay registered (OpenAPI, other methods). No Starlette ``Request`` is built unless an exception
    handler needs one (`_FastRequest`), and a complete answer is a `RawResponse`. Measured
    (proxy-peers bench): the framework layers skipped here were the larger part of the proxy's
    per-request CPU."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        forward: Callable[[Incoming, str, str], Awaitable[Response]],
        paths: dict[str, str],
    ) -> None:
        self.app, self.forward, self.paths = app, forward, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in self.paths:
            await self.app(scope, receive, send)
            return
        try:
            response = await self.forward(_FastRequest(scope, receive), path, self.paths[path])
        except Exception as exc:
            response = await handled(Request(scope, receive), exc)
        try:
            await response(scope, receive, send)
        finally:  # a stream the client left before or during its body still gives its lease back
            body = getattr(response, "body_iterator", None)
            if isinstance(body, Relay):
                await body.aclose()
