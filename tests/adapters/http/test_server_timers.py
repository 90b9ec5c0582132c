"""The gateway's connection timers (`server.HeadTimeoutProtocol`): one lazily re-armed timer per
connection carries both the request-head timeout and the keep-alive timeout. A connection in
steady use outlives many of the timer's due times (it re-arms instead of closing), an idle
keep-alive connection is closed, and so is one whose next request head never completes, also
after the timer has been re-armed by earlier requests."""

from __future__ import annotations

import asyncio
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


async def _reading_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body (after ``x-wait`` seconds when the header says so), answers its size."""
    if scope["type"] == "lifespan":
        await _app(scope, receive, send)
        return
    import asyncio

    wait = dict(scope["headers"]).get(b"x-wait")
    if wait:
        await asyncio.sleep(float(wait))
    size, more = 0, True
    while more:
        msg = await receive()
        size += len(msg.get("body", b""))
        more = msg.get("more_body", False)
    body = b"ok" if size else b"no"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": body})


def test_a_body_dripped_a_byte_at_a_time_is_closed() -> None:
    # 100 bytes announced, one sent every 0.1 s: the body falls behind the least rate once the
    # grace (the head timeout) is over, and the server closes the connection long before the drip
    # would end. (Before, the connection stayed open for as long as the client dripped.)
    with running(_reading_app, keep_alive_s=KEEP_ALIVE_S, header_timeout_s=HEADER_TIMEOUT_S) as url:
        s = _connect(url)
        with s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            deadline = time.monotonic() + CLOSE_BOUND_S
            closed = False
            while time.monotonic() < deadline and not closed:
                try:
                    s.sendall(b"x")
                except OSError:
                    closed = True
                    break
                ready, _, _ = select.select([s], [], [], 0.1)
                if ready:
                    try:
                        closed = s.recv(4096) == b""
                    except ConnectionError:
                        closed = True
            assert closed


def test_a_body_the_app_has_not_read_yet_is_not_cut() -> None:
    # 4 MiB sent at once to an app that reads it only after 3 s, with a least rate that allows
    # every byte the server could have read before it paused reading past 64 KiB (flow control)
    # well under 3 s: the pause is the server's, not a slow client's, and the request completes.
    body = b"y" * (4 << 20)
    fast = {"min_body_bytes_per_s": 8 << 20}
    with running(_reading_app, keep_alive_s=KEEP_ALIVE_S, header_timeout_s=HEADER_TIMEOUT_S, **fast) as url:
        s = _connect(url)
        with s:
            head = b"POST /x HTTP/1.1\r\nHost: t\r\nx-wait: 3\r\nContent-Length: %d\r\n\r\n" % len(body)
            s.sendall(head + body)
            assert _answer(s).startswith(b"HTTP/1.1 200")


def _flood_head(s: socket.socket, head: bytes, filler: bytes, total: int) -> bytes:
    """Send ``head`` then up to ``total`` bytes of ``filler`` (never ending the head), 16 KiB at a
    time, stopping once the server answers or closes; returns what the server sent."""
    s.sendall(head)
    sent = 0
    while sent < total:
        ready, _, _ = select.select([s], [], [], 0)
        if ready:
            break
        try:
            s.sendall(filler)
        except OSError:
            break
        sent += len(filler)
    answer = b""
    deadline = time.monotonic() + CLOSE_BOUND_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], 0.2)
        if not ready:
            continue
        try:
            data = s.recv(4096)
        except ConnectionError:
            break
        if not data:
            break
        answer += data
    return answer


def test_a_request_head_over_the_size_limit_is_answered_431_and_closed() -> None:
    # One header value of 4 MiB sent at full speed, well within the head timeout: the server stops
    # reading it past `MAX_HEADER_BYTES` (plus at most one read). Before, httptools took heads of any
    # size (50 MB took 10 s of the event loop's CPU, copying the growing value at every read).
    from gpupool.adapters.http.server import MAX_HEADER_BYTES

    with running(_app, header_timeout_s=60.0) as url:
        s = _connect(url)
        with s:
            head = b"GET /x HTTP/1.1\r\nHost: t\r\nX-Big: "
            answer = _flood_head(s, head, b"a" * 16384, 4 << 20)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
            assert str(MAX_HEADER_BYTES).encode() in answer
        s = _connect(url)  # the same with very many small headers
        with s:
            many = b"".join(b"X-%d: a\r\n" % i for i in range(2000))
            answer = _flood_head(s, b"GET /x HTTP/1.1\r\nHost: t\r\n", many, 4 << 20)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        s = _connect(url)  # a head just under the limit is served
        with s:
            s.sendall(
                b"GET /x HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES - 100) + b"\r\n\r\n"
            )
            assert _answer(s).startswith(b"HTTP/1.1 200")


def test_a_client_that_reads_nothing_of_a_streamed_answer_is_disconnected() -> None:
    """A ``/v1/events``-like stream to a client that never reads: the server's buffers fill, its
    transport pauses writing, and the stream waited for ever (a connection slot held for good). With
    the write-stall bound the connection is dropped and the stream ends (its clean-up runs)."""
    import threading

    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    ended = threading.Event()

    async def chunks() -> Any:  # (awaits between chunks, as a stream of events or tokens does)
        try:
            while True:
                yield b"x" * 65536
                await asyncio.sleep(0)
        finally:
            ended.set()

    async def stream(_: Any) -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="text/plain")

    with running(Starlette(routes=[Route("/x", stream)]), write_stall_s=0.5) as url:
        s = _connect(url)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(REQUEST)  # and never read a byte of the answer
        try:
            assert ended.wait(CLOSE_BOUND_S), "the server kept the stream to a client that reads nothing"
        finally:
            s.close()
