"""`server_config`: the uvicorn configuration of the gateway, with bounded connections and timeouts.

Uvicorn alone keeps a connection that never sends a complete request head open forever (its
keep-alive timer only starts after a first response, and any byte cancels it, so a client sending
nothing, or a header byte now and then, holds a socket and a file descriptor indefinitely). Here:

- `HEADER_TIMEOUT_S` (10 s): from the moment a connection opens, or a new request on it begins, its
  request line and headers must be complete within this time, else the server closes it;
- `MIN_BODY_BYTES_PER_S` (16 KiB/s): once the head is complete, the body must keep up this
  average rate after the same grace (``header_timeout_s``): a body of B bytes must be complete
  within ``header_timeout_s + B / MIN_BODY_BYTES_PER_S`` seconds of the head, else the connection
  is closed. Time while the server itself paused reading (flow control: the app has not taken
  the first 64 KiB yet) does not count. Without it a client sending a body a byte a second held a
  connection (and a request slot) for as long as it liked;
- `KEEP_ALIVE_S` (5 s): an idle keep-alive connection between requests is closed after this;
- `MAX_CONNECTIONS` (1000): uvicorn's ``limit_concurrency`` (open connections + running requests);
  past it a new request is answered 503 at once instead of queueing without bound (`overloaded`:
  the route family's error shape, code ``overloaded``, ``Retry-After: OVERLOAD_RETRY_AFTER_S``,
  the connection closed after it; not uvicorn's bare text);
- `MAX_HEADER_BYTES` (64 KiB): the most a request line plus headers may take; a head still
  incomplete past it (counted from the first read after the one its request began in, so at most
  one read more is taken) is answered 431 and the connection closed. httptools itself takes heads
  of any size, and copies a header value each time more of it arrives: a 50 MB header took 10 s
  of the event loop's CPU before the head timeout could end it. (h11 gets the same limit.)
- `WRITE_STALL_S` (60 s): a client that reads nothing of an answer for this long while the server
  has more to send (the transport paused writing: its buffers are full) is disconnected. Without
  it a ``/v1/events`` subscriber that never read held its connection for ever (its queue overflows
  and its stream should end, but the server waited for ever to send to it), and so could a stalled
  reader of a streamed completion.

Invariant: every connection is either inside a request whose head and body are complete, or has a
timer that will close it; no connection can stay open without sending a complete request at the
rates above.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.adapters.http.errors import err, is_openai_path, openai_err
from gpupool.adapters.http.native import NativeCycle, NativeProxy

HEADER_TIMEOUT_S = 10.0
MIN_BODY_BYTES_PER_S = 16 * 1024
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 1000
MAX_HEADER_BYTES = 64 * 1024
WRITE_STALL_S = 60.0
OVERLOAD_RETRY_AFTER_S = 1


async def overloaded(scope: Any, receive: Any, send: Any) -> None:
    """The answer past the connection limit: 503 in the route family's error shape with
    ``Retry-After``, and ``connection: close`` (uvicorn then closes it, freeing a slot)."""
    msg = (
        "the gateway is at its connection limit (gpupool serve --max-connections); "
        f"retry after {OVERLOAD_RETRY_AFTER_S} s"
    )
    path = scope.get("path", "")
    if is_openai_path(path):
        response = openai_err(503, msg, "overloaded")
        response.headers["Retry-After"] = str(OVERLOAD_RETRY_AFTER_S)
    else:
        response = err(503, msg, "overloaded", retry=OVERLOAD_RETRY_AFTER_S)
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a timer on reading each request head.

    The head timeout and uvicorn's keep-alive timeout share one lazily re-armed timer per
    connection: each is a deadline (a float), set and cleared per request without creating or
    cancelling a timer handle; the timer, when it fires, closes the connection if a deadline has
    passed, else re-arms itself for the nearest one still set (or lapses when none is). Invariant:
    while a deadline is set, the timer is armed to fire no later than it. (A timer handle created
    and cancelled two or three times per request was measurable in ``bench proxy-peers``.)"""

    header_timeout_s: float = HEADER_TIMEOUT_S
    min_body_bytes_per_s: int = MIN_BODY_BYTES_PER_S
    max_header_bytes: int = MAX_HEADER_BYTES
    write_stall_s: float = WRITE_STALL_S
    native: NativeProxy | None = None
    """Set when the app has an OpenAI proxy: its POST routes are answered by `native`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: float | None = None
        self._idle_deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._write_deadline: float | None = None  # while the transport has paused writing
        self._body_since: float | None = None  # the head's completion while its body is due
        self._body_bytes = 0
        self._head_bytes = 0  # of the head in progress, counted by `data_received`
        self._head_began = False  # a request began during the current `data_received`
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, then the head's size bound: bytes read while a head stays incomplete count
        towards `MAX_HEADER_BYTES`, except those of the read its request began in (how much of that
        read was the previous request's is not known, so the bound is the limit plus one read)."""
        self._head_began = False
        super().data_received(data)
        if self._head_deadline is None or self._body_since is not None or self._head_began:
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._head_deadline = None
            self.send_431_response()

    def send_431_response(self) -> None:
        """431 with a text naming the limit, then close (as uvicorn's own 400 for a bad head)."""
        msg = f"request line and headers larger than {self.max_header_bytes} bytes".encode("ascii")
        head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(msg))
        self.transport.write(b"".join(head) + msg)
        self.transport.close()

    # -- the connection's one timer
    def _wake_by(self, at: float) -> None:
        """Make the timer fire no later than ``at`` (loop time)."""
        timer = self._timer
        if timer is None or self._timer_at > at:
            if timer is not None:
                timer.cancel()
            self._timer_at = at
            self._timer = self.loop.call_at(at, self._on_timer)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_deadline = self.loop.time() + self.write_stall_s
        self._wake_by(self._write_deadline)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_deadline = None

    def _on_timer(self) -> None:
        self._timer = None
        now = self.loop.time() + _TIMER_SLACK_S  # (a timer may fire a hair before its due time)
        stall = self._write_deadline
        if stall is not None and stall <= now:  # the client reads nothing: what is unsent is dropped
            self._write_deadline = self._head_deadline = self._idle_deadline = None
            self.transport.abort()  # (close() would wait for ever to flush to it)
            return
        head, idle = self._head_deadline, self._idle_deadline
        if head is not None and head <= now and self._body_since is not None:
            head = self._head_deadline = self._body_due(now)
        if (head is not None and head <= now) or (idle is not None and idle <= now):
            self._head_deadline = self._idle_deadline = None
            if not self.transport.is_closing():
                self.transport.close()
            return
        if head is not None or idle is not None or stall is not None:
            self._wake_by(min(x for x in (head, idle, stall) if x is not None))

    def _body_due(self, now: float) -> float:
        """When the body in progress must be complete: grace plus its bytes at the least rate, or
        a fresh grace from now while reading is paused by the server (not the client's delay)."""
        if self.flow.read_paused:
            self._body_since = now
            self._body_bytes = 0
        assert self._body_since is not None
        return self._body_since + self.header_timeout_s + self._body_bytes / self.min_body_bytes_per_s

    def _arm_head_timer(self) -> None:
        if self._head_deadline is None:
            at = self._head_deadline = self.loop.time() + self.header_timeout_s
            self._wake_by(at)

    def _unset_keepalive_if_required(self) -> None:  # uvicorn's: cancelled its keep-alive timer
        self._idle_deadline = None

    def on_response_complete(self) -> None:
        """uvicorn's, with the keep-alive timeout as a deadline on the connection's timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_deadline = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            at = self._idle_deadline = self.loop.time() + self.timeout_keep_alive
            self._wake_by(at)

    def on_message_begin(self) -> None:
        """uvicorn's, except that the ASGI scope is built (`asgi_scope`) only for a request that
        takes the ASGI path: a native proxy request has no use for one."""
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = None  # type: ignore[assignment]
        self._head_bytes = 0
        self._head_began = True
        self._arm_head_timer()

    def asgi_scope(self) -> Any:
        """The scope uvicorn's ``on_message_begin`` builds (same keys, same values)."""
        return {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_headers_complete(self) -> None:
        # the head's deadline becomes the body's (`_body_due`), cleared when the message completes
        self._body_since = self.loop.time()
        self._body_bytes = 0
        native: NativeProxy | None = self.native
        if native is not None and self._native_ok():
            route = native.route(self.url)
            if route is not None:
                keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
                cycle = NativeCycle(self, native, route[0], route[1], keep_alive)
                self.cycle = cycle  # type: ignore[assignment]
                cycle.begin()
                return
        self.scope = self.asgi_scope()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        cycle: Any = self.cycle
        if cycle.__class__ is NativeCycle:  # (never an upgrade: `_native_ok`)
            cycle.on_body(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._head_deadline = self._body_since = None
        cycle: Any = self.cycle
        if cycle.__class__ is NativeCycle:
            cycle.on_message_complete()
        else:
            super().on_message_complete()

    def _native_ok(self) -> bool:
        """A proxy POST may skip ASGI: no pipelined request pending, no 100-continue, no upgrade,
        and below uvicorn's concurrency limit (past it uvicorn answers 503 itself)."""
        if self.parser.get_method() != b"POST" or self.expect_100_continue or self.parser.should_upgrade():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False
        limit = self.limit_concurrency
        return limit is None or (len(self.connections) < limit and len(self.tasks) < limit)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's, with its bare-text 503 past the connection limit replaced by `overloaded`."""
        super()._start_asgi_task(cycle, overloaded if app is service_unavailable else app)

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_deadline = self._idle_deadline = self._write_deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)


_TIMER_SLACK_S = 0.001


def server_config(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    keep_alive_s: int = KEEP_ALIVE_S,
    max_connections: int = MAX_CONNECTIONS,
    min_body_bytes_per_s: int = MIN_BODY_BYTES_PER_S,
    write_stall_s: float = WRITE_STALL_S,
    **extra: Any,
) -> uvicorn.Config:
    """A uvicorn ``Config`` for ``app`` with the limits above (``extra``: more ``Config`` options)."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s={header_timeout_s}: must be > 0")
    if type(min_body_bytes_per_s) is not int or min_body_bytes_per_s < 1:
        raise ValueError(f"min_body_bytes_per_s={min_body_bytes_per_s}: must be an integer >= 1")
    if type(max_connections) is not int or max_connections < 1:
        raise ValueError(f"max_connections={max_connections}: must be an integer >= 1")
    native = getattr(getattr(app, "state", None), "native_proxy", None)
    protocol = type(
        "GatewayHttpProtocol",
        (HeadTimeoutProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "min_body_bytes_per_s": min_body_bytes_per_s,
            "write_stall_s": write_stall_s,
            "native": native if isinstance(native, NativeProxy) else None,
        },
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        timeout_keep_alive=keep_alive_s,
        limit_concurrency=max_connections,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        log_level=extra.pop("log_level", "warning"),
        **extra,
    )
