"""`UpstreamPool`: a small HTTP/1.1 keep-alive client on asyncio protocols, for proxying to backends.

Why hand-rolled rather than httpx or aiohttp: the proxy's per-request CPU is the benchmark it is
held to (``gpupool bench proxy-peers``, against vLLM's Rust router). Measured on the 2-core
benchmark machine: one httpx request costs ~1 ms of CPU, an exchange on asyncio streams ~0.2 ms,
and this client (an ``asyncio.Protocol`` per connection, responses parsed by ``httptools``, the C
parser uvicorn uses, one future per request) well under 0.1 ms. Parsing, chunked decoding and
framing are httptools'; this module only does connection reuse and buffering.

Scope (what backends need, nothing more): ``http://`` URLs, request bodies with Content-Length,
responses framed by Content-Length, ``Transfer-Encoding: chunked`` (decoded) or the connection's end,
keep-alive reuse of fully-read connections, one retry on a fresh connection when a reused idle
connection turns out closed before any answer came.

Why that retry is safe for a non-idempotent POST (an inference the engine would otherwise run
twice): a uvicorn server (vLLM's, the emulated backend's) closes a connection before answering only
on its keep-alive timeout, which it arms when a response ends and disarms on the next byte it
reads, so the request it drops was never read. A server that takes a request and then closes
without a response head would see it twice; `tests/e2e/gateway/test_upstream_keepalive_race.py`
makes the race frequent against the real backend and counts what its engine admitted.

Invariants:
- a connection returns to the idle pool only after its response was read to the end and the
  backend did not ask to close it; a request cancelled before its response head closes its
  connection (a backend that sees its client go aborts the request: vLLM does);
- a streamed body never buffers more than `HIGH_WATER_BYTES` ahead of its reader: the socket stops
  being read until the reader catches up (back-pressure onto the backend); `read` (a whole body)
  takes what was buffered whenever reading paused, so a body of any size comes to its end.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from typing import cast
from urllib.parse import urlsplit

import httptools

MAX_TARGETS = 1024
"""Parsed (method, url) pairs kept; the cache is emptied when it reaches this many."""
HIGH_WATER_BYTES = 256 * 1024
"""A streamed body buffered past this pauses reading the backend's socket."""


class UpstreamError(Exception):
    pass


class _Conn(asyncio.Protocol):
    """One backend connection and the response being read on it (at most one at a time).

    The timeout on a response head is a deadline checked by one lazily re-armed timer per
    connection (set and cleared per request without creating or cancelling a timer handle; the
    timer, when it fires early, re-arms itself for the current deadline or lapses if none is set)."""

    head_done: bool
    timeout: bool

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.error: str | None = None
        self.loop = asyncio.get_running_loop()
        self.deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._reset()

    def set_deadline(self, timeout_s: float) -> None:
        """`timed_out` runs once ``timeout_s`` passes, unless `deadline` is cleared (None) first."""
        at = self.deadline = self.loop.time() + timeout_s
        if self._timer is None or self._timer_at > at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        at = self.deadline
        if at is None:
            return
        if at <= self.loop.time() + 0.001:  # (a timer may fire a hair before its due time)
            self.deadline = None
            self.timed_out()
        else:
            self._arm(at)

    def timed_out(self) -> None:
        if not self.head_done:
            self.timeout = True
            self._fail("TimeoutError: no answer within the proxy timeout")

    def _reset(self) -> None:
        self.timeout = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.framed = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"bad response from the backend: {exc}")
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.head_done and not self.complete and not self.framed:
            self.complete = True  # a body framed by the connection's end is whole now
            self._wake()
        elif not self.complete:
            self._fail("backend closed the connection" + ("" if self.head_done else " before answering"))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        h = self.headers
        self.framed = "content-length" in h or "chunked" in h.get("transfer-encoding", "").lower()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- for the response reader
    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def take(self) -> bytes:
        data = self.chunks.popleft()
        self.buffered -= len(data)
        if self.paused and self.buffered <= HIGH_WATER_BYTES // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data


class UpstreamResponse:
    def __init__(self, pool: UpstreamPool, key: tuple[str, int], conn: _Conn) -> None:
        self._pool, self._key = pool, key
        self._conn: _Conn | None = conn
        self.status_code = conn.status
        self.headers = conn.headers

    async def aiter_raw(self) -> AsyncGenerator[bytes, None]:
        conn = self._conn
        assert conn is not None, "response body already consumed"
        try:
            while True:
                if conn.chunks:
                    yield conn.take()
                elif conn.complete:
                    break
                elif conn.error is not None:
                    raise UpstreamError(f"{conn.error} mid-body")
                else:
                    await conn.wait()
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        conn = self._conn
        assert conn is not None, "response body already consumed"
        parts: list[bytes] = []
        try:
            while not conn.complete:
                if conn.error is not None:
                    raise UpstreamError(f"{conn.error} mid-body")
                while conn.paused and conn.chunks:  # taken off the connection, so it reads on
                    parts.append(conn.take())
                await conn.wait()
            chunks = conn.chunks
            parts += chunks
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            chunks.clear()
            conn.buffered = 0
            if conn.paused and conn.transport is not None:  # the last chunks crossed the mark: a
                conn.paused = False  # pooled connection that stayed paused never read its next answer
                conn.transport.resume_reading()
        finally:
            self._close()
        return data

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        """Pool the connection if its response was read whole and it stays open, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and conn.keep_alive and not conn.closed and not conn.chunks:
            self._pool._release(self._key, conn)
        elif conn.transport is not None:
            conn.transport.close()


class UpstreamPool:
    def __init__(
        self, *, timeout_s: float = 300.0, connect_timeout_s: float = 5.0, max_idle: int = 256
    ) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._targets: dict[tuple[str, str], tuple[tuple[str, int], str]] = {}

    async def request(
        self, method: str, url: str, *, content: bytes, headers: dict[str, str]
    ) -> UpstreamResponse:
        target = self._targets.get((method, url))
        if target is None:
            target = self._target(method, url)
        key, start = target
        head = [start, "\r\nContent-Length: ", str(len(content))]
        for k, v in headers.items():
            head += ("\r\n", k, ": ", v)
        head.append("\r\n\r\n")
        raw = "".join(head).encode("latin-1") + content
        for attempt in (0, 1):
            conn, reused = self._idle_conn(key), True
            if conn is None:
                conn, reused = await self._connect(key), False
            assert conn.transport is not None
            conn.transport.write(raw)
            conn.set_deadline(self.timeout_s)
            try:
                while not conn.head_done:
                    if conn.error is not None:
                        raise UpstreamError(conn.error)
                    await conn.wait()
            except UpstreamError as exc:
                conn.transport.close()
                if not reused or attempt or conn.timeout:
                    raise UpstreamError(str(exc)) from None
                continue
            except BaseException:  # cancelled while the backend works on it: closing it aborts there
                conn.transport.close()
                raise
            finally:
                conn.deadline = None
            if not 100 <= conn.status <= 599:  # a broken backend (502 to the client), not a status to pass on
                conn.transport.close()
                raise UpstreamError(f"backend answered status {conn.status}, not an HTTP status (100-599)")
            return UpstreamResponse(self, key, conn)
        raise UpstreamError("unreachable")  # pragma: no cover

    def _idle_conn(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn._reset()
                return conn
        return None

    def _target(self, method: str, url: str) -> tuple[tuple[str, int], str]:
        """(host, port) and the request line + Host header for ``url``, cached (a few backends)."""
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise UpstreamError(f"unsupported backend url {url!r} (http:// only)")
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        if len(self._targets) >= MAX_TARGETS:
            self._targets.clear()
        t = self._targets[(method, url)] = (
            (u.hostname, u.port or 80),
            f"{method} {path} HTTP/1.1\r\nHost: {u.netloc}",
        )
        return t

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Conn, *key)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn

    def _release(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle and not conn.closed:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                if c.transport is not None:
                    c.transport.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing
