"""The gateway's connection timers (`server.HeadTimeoutProtocol`): one lazily re-armed timer per
connection carries both the request-head timeout and the keep-alive timeout. A connection in
steady use outlives many of the timer's due times (it re-arms instead of closing), an idle
keep-alive connection is closed, and so is one whose next request head never completes, also
after the timer has been re-armed by earlier requests."""

from __future__ import annotations

import select
import socket
import time
from typing import Any

from tests.adapters.http.servers import running

KEEP_ALIVE_S = 1
HEADER_TIMEOUT_S = 0.5
CLOSE_BOUND_S = 20.0  # generous bound on waiting for the server to close: not a timing claim
REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _answer(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\r\n\r\nok"):
        data = s.recv(4096)
        assert data, f"connection closed mid-answer after {buf!r}"
        buf += data
    return buf


def _closed_by_server(s: socket.socket) -> bool:
    """True once the server closes ``s`` (EOF) within `CLOSE_BOUND_S`."""
    deadline = time.monotonic() + CLOSE_BOUND_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], 0.2)
        if ready:
            try:
                return s.recv(4096) == b""
            except ConnectionError:
                return True
    return False


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=CLOSE_BOUND_S)


def test_a_connection_in_steady_use_outlives_its_timers_and_is_closed_once_idle() -> None:
    with running(_app, keep_alive_s=KEEP_ALIVE_S, header_timeout_s=HEADER_TIMEOUT_S) as url:
        s = _connect(url)
        with s:
            t_end = time.monotonic() + 3 * KEEP_ALIVE_S  # several head and keep-alive due times
            n = 0
            while time.monotonic() < t_end:
                s.sendall(REQUEST)
                assert _answer(s).startswith(b"HTTP/1.1 200")
                n += 1
                time.sleep(0.1)
            assert n >= 5
            assert _closed_by_server(s)  # idle now: the keep-alive timeout closes it


def test_a_request_head_left_unfinished_after_earlier_requests_is_closed() -> None:
    with running(_app, keep_alive_s=KEEP_ALIVE_S, header_timeout_s=HEADER_TIMEOUT_S) as url:
        s = _connect(url)
        with s:
            for _ in range(3):
                s.sendall(REQUEST)
                _answer(s)
            s.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n")  # the head never ends
            assert _closed_by_server(s)
