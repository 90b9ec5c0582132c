"""`NativeProxy`: the OpenAI proxy's POST routes answered at the HTTP protocol, below ASGI.

Role: the gateway's uvicorn protocol (`server.HeadTimeoutProtocol`) hands a request here, instead of
building an ASGI cycle, when it is a ``POST`` on one of the proxy paths (exact path, no query
needed), the connection has no other request in flight (no pipelining), it does not ``Expect:
100-continue`` and uvicorn's concurrency limit is not reached. Everything else, and every request
made through ASGI directly (tests' in-process transports), takes the ASGI path, where
`proxy.ProxyFastPath` calls the *same* ``forward`` handler: one implementation of the proxy, two
ways in. Why: measured with ``gpupool bench proxy-peers`` (py-spy), the ASGI layers above the
handler (uvicorn's cycle, the proxy-headers, FastAPI/Starlette, error and body-limit middlewares,
and the ``send`` wrappers each of them adds) were a fifth of the proxy's CPU per request.

What it keeps of the ASGI path, so the two cannot be told apart by a client:
- the body limit (`limits.BodyLimit`'s rule and 413 body for the proxy family): a declared
  ``Content-Length`` over the limit is answered before the body is read, a chunked body is cut off
  once it passes the limit; the connection is closed after a 413;
- the app's exception handlers (looked up by the exception's type, as Starlette does), else a 500
  in OpenAI's error shape;
- uvicorn's keep-alive, ``Connection: close``, default headers (``date``, ``server``), graceful
  shutdown (the task is in the server's task set) and flow control (writes wait while the
  transport is paused; a streamed response stops and runs its clean-up when the client goes; one
  whose body fails mid-way, a backend that died, closes the connection with the chunked body
  unterminated instead of leaving it open until the keep-alive timer).
  Beyond it: a request whose client hangs up is cancelled wherever it waits, a complete answer
  too (the ASGI path lets those run to their end), so the backend stops working for nobody.

Invariants: at most one native request per connection at a time; the response is written only by
the request's own task; the protocol's ``on_response_complete`` runs once per request, after the
last byte was written, exactly as uvicorn's own cycle does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

from gpupool.adapters.http.errors import handled
from gpupool.adapters.http.limits import DEFAULT_MAX_PROXY_BODY_BYTES, body_413

log = logging.getLogger("gpupool.gateway")

Forward = Callable[[Any, str, str], Awaitable[Response]]


def _status_line(code: int) -> bytes:
    try:
        phrase = HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("latin-1")


_STATUS = {c: _status_line(c) for c in (200, 400, 401, 404, 413, 429, 500, 502, 503)}


class NativeProxy:
    """What the protocol needs to answer a proxy request: the handler, the paths and the limit."""

    def __init__(self, *, app: Any, forward: Forward, paths: dict[str, str]) -> None:
        self.app = app
        self.forward = forward
        self.paths = {p.encode("ascii"): (p, kind) for p, kind in paths.items()}
        self._state: dict[str, Any] = app.state._state  # (Starlette's State keeps its values here)
        self._defaults: list[tuple[bytes, bytes]] | None = None
        self._default_head = b""

    @property
    def max_body_bytes(self) -> int:
        return int(self._state.get("max_proxy_body_bytes", DEFAULT_MAX_PROXY_BODY_BYTES))

    def default_head(self, server_state: Any) -> bytes:
        """uvicorn's default header lines (``date``, ``server``), joined once per list: the server
        replaces the list (never edits it) when the date changes."""
        defaults = server_state.default_headers
        if defaults is not self._defaults:
            self._default_head = b"".join(k + b": " + v + b"\r\n" for k, v in defaults)
            self._defaults = defaults
        return self._default_head

    def route(self, raw_url: bytes) -> tuple[str, str] | None:
        """(path, kind) when ``raw_url`` is one of the proxy paths (its query, if any, is ignored)."""
        return self.paths.get(raw_url.split(b"?", 1)[0])


class NativeCycle:
    """One native request on one connection. Duck-types the fields of uvicorn's
    ``RequestResponseCycle`` that its protocol touches (``body``, ``more_body``, ``message_event``,
    ``response_complete``, ``disconnected``, ``keep_alive``); ``message_event.set()`` is this
    object's `set`, called by the protocol when body bytes arrive, the body ends or the
    connection is lost."""

    __slots__ = (
        "body",
        "disconnected",
        "headers",
        "keep_alive",
        "kind",
        "limit",
        "message_event",
        "more_body",
        "native",
        "path",
        "proto",
        "response_complete",
        "task",
    )

    def __init__(self, proto: Any, native: NativeProxy, path: str, kind: str, keep_alive: bool) -> None:
        self.proto, self.native, self.path, self.kind = proto, native, path, kind
        # reversed: the first value of a repeated name wins, as with Starlette's Headers.get
        h = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(proto.headers)}
        self.headers = h
        self.body = bytearray()
        self.more_body = True
        self.message_event = self
        self.response_complete = False
        self.disconnected = False
        self.keep_alive = keep_alive
        self.task: asyncio.Task[None] | None = None
        self.limit = native.max_body_bytes

    def begin(self) -> None:
        """Called at the end of the request head: refuse a declared body over the limit now."""
        cl = self.headers.get("content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                n = -1
            if n > self.limit:
                self._start(self._too_large())

    # -- the protocol's body callbacks (uvicorn's ``on_body`` / ``on_message_complete`` for this cycle)
    def on_body(self, body: bytes) -> None:
        """uvicorn's ``on_body`` for this cycle (its upgrade check is moot: `_native_ok`)."""
        if self.response_complete:
            return
        self.body += body
        if len(self.body) > HIGH_WATER_LIMIT:
            self.proto.flow.pause_reading()  # `set` resumes it unless the body is refused
        self.set()

    def on_message_complete(self) -> None:
        if self.response_complete:
            return
        self.more_body = False
        self.set()

    # -- the protocol's message_event
    def set(self) -> None:
        if self.disconnected:
            # the client left: stop its request wherever it waits (`forward` gives the lease back
            # on a cancel and the backend connection is closed, so the engine aborts the work too)
            if self.task is not None and not self.task.done():
                self.task.cancel()
            return
        if self.task is not None:
            return
        if len(self.body) > self.limit:
            self._start(self._too_large())
        elif not self.more_body:
            self._start(self._run())
        else:
            self.proto.flow.resume_reading()  # uvicorn pauses past 64 KiB; the limit bounds it here

    def _start(self, coro: Awaitable[None]) -> None:
        task = self.proto.loop.create_task(coro)
        tasks = self.proto.tasks
        task.add_done_callback(tasks.discard)
        tasks.add(task)
        self.task = task

    # -- the request
    async def _too_large(self) -> None:
        self.keep_alive = False
        body = body_413(self.path, self.limit)
        head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        self._write_whole(413, head, body)
        self._done()

    async def _run(self) -> None:
        try:
            response = await self.native.forward(_Incoming(self), self.path, self.kind)
        except asyncio.CancelledError:
            self._done()
            raise
        except Exception as exc:
            try:
                response = await self._handled(exc)
            except Exception:
                log.exception("proxy request failed")
                response = Response(
                    json.dumps(
                        {
                            "error": {
                                "message": "internal error",
                                "type": "server_error",
                                "param": None,
                                "code": None,
                            }
                        }
                    ).encode(),
                    status_code=500,
                    media_type="application/json",
                )
        try:
            if isinstance(response, StreamingResponse):
                await self._stream(response)
            else:
                self._write_whole(response.status_code, response.raw_headers, bytes(response.body))
        finally:
            self._done()

    async def _handled(self, exc: Exception) -> Response:
        scope = self.proto.asgi_scope()
        scope.update(method="POST", path=self.path, raw_path=self.path.encode(), query_string=b"")
        scope["app"] = self.native.app
        return await handled(Request(scope), exc)

    def _head(self, status: int, headers: list[tuple[bytes, bytes]], extra: list[bytes]) -> list[bytes]:
        out = [_STATUS.get(status) or _status_line(status), self.native.default_head(self.proto.server_state)]
        for k, v in headers:
            out += (k, b": ", v, b"\r\n")
        out += extra
        if not self.keep_alive:
            out.append(b"connection: close\r\n")
        out.append(b"\r\n")
        return out

    def _write_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.disconnected or self.proto.transport.is_closing():
            return  # the client went away: nothing to answer (uvloop refuses writes to a closed transport)
        out = self._head(status, headers, [])
        out.append(body)
        self.proto.transport.write(b"".join(out))

    async def _stream(self, response: StreamingResponse) -> None:
        it = response.body_iterator
        transport, flow = self.proto.transport, self.proto.flow
        try:
            if self.disconnected or transport.is_closing():
                return
            transport.write(
                b"".join(
                    self._head(
                        response.status_code, response.raw_headers, [b"transfer-encoding: chunked\r\n"]
                    )
                )
            )
            async for chunk in it:
                if (
                    self._gone() or transport.is_closing()
                ):  # (a method: the flag changes while this task awaits)
                    return
                data = (
                    chunk
                    if isinstance(chunk, bytes)
                    else bytes(chunk, "utf-8")
                    if isinstance(chunk, str)
                    else bytes(chunk)
                )
                if data:
                    transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                if flow.write_paused:
                    await flow.drain()
            if not self._gone():
                transport.write(b"0\r\n\r\n")
        except Exception as exc:  # the backend failed mid-body: the client must see the body cut short
            self.keep_alive = False  # (`_done` closes the connection, as uvicorn's cycle does)
            log.warning("proxy stream %s cut short: %s: %s", self.path, type(exc).__name__, exc)
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()

    def _gone(self) -> bool:
        return self.disconnected

    def _done(self) -> None:
        if self.response_complete:
            return
        self.response_complete = True
        proto = self.proto
        if not self.keep_alive or self.disconnected:
            proto.transport.close()
        proto.on_response_complete()


class _Incoming:
    """What `forward` reads of a native request: its headers and its (already complete) body."""

    __slots__ = ("_cycle", "headers")

    def __init__(self, cycle: NativeCycle) -> None:
        self.headers = cycle.headers
        self._cycle = cycle

    async def body(self) -> bytes:
        return bytes(self._cycle.body)
