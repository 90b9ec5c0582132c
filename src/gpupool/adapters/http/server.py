"""`server_config`: the uvicorn configuration of the gateway, with bounded connections and timeouts.

Uvicorn alone keeps a connection that never sends a complete request head open forever (its
keep-alive timer only starts after a first response, and any byte cancels it, so a client sending
nothing, or a header byte now and then, holds a socket and a file descriptor indefinitely). Here:

- `HEADER_TIMEOUT_S` (10 s): from the moment a connection opens, or a new request on it begins, its
  request line and headers must be complete within this time, else the server closes it;
- `KEEP_ALIVE_S` (5 s): an idle keep-alive connection between requests is closed after this;
- `MAX_CONNECTIONS` (1000): uvicorn's ``limit_concurrency`` (open connections + running requests);
  past it a new request is answered 503 at once instead of queueing without bound;
- `MAX_HEADER_BYTES`: h11's limit on an incomplete request head (for the h11 parser; httptools
  has its own fixed limit of 80 KiB).

Invariant: every connection is either inside a request whose head is complete, or has a timer that
will close it; no connection can stay open without sending a complete request head.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.adapters.http.native import NativeCycle, NativeProxy

HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 1000
MAX_HEADER_BYTES = 64 * 1024


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a timer on reading each request head."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    native: NativeProxy | None = None
    """Set when the app has an OpenAI proxy: its POST routes are answered by `native`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        native: NativeProxy | None = self.native
        if native is not None and self._native_ok():
            route = native.route(self.url)
            if route is not None:
                keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
                self.scope["method"] = "POST"
                cycle = NativeCycle(self, native, route[0], route[1], keep_alive)
                self.cycle = cycle  # type: ignore[assignment]
                cycle.begin()
                return
        super().on_headers_complete()

    def _native_ok(self) -> bool:
        """A proxy POST may skip ASGI: no pipelined request pending, no 100-continue, no upgrade,
        and below uvicorn's concurrency limit (past it uvicorn answers 503 itself)."""
        if self.parser.get_method() != b"POST" or self.expect_100_continue or self.parser.should_upgrade():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False
        limit = self.limit_concurrency
        return limit is None or (len(self.connections) < limit and len(self.tasks) < limit)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


def server_config(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    keep_alive_s: int = KEEP_ALIVE_S,
    max_connections: int = MAX_CONNECTIONS,
    **extra: Any,
) -> uvicorn.Config:
    """A uvicorn ``Config`` for ``app`` with the limits above (``extra``: more ``Config`` options)."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s={header_timeout_s}: must be > 0")
    if type(max_connections) is not int or max_connections < 1:
        raise ValueError(f"max_connections={max_connections}: must be an integer >= 1")
    native = getattr(getattr(app, "state", None), "native_proxy", None)
    protocol = type(
        "GatewayHttpProtocol",
        (HeadTimeoutProtocol,),
        {"header_timeout_s": header_timeout_s, "native": native if isinstance(native, NativeProxy) else None},
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
