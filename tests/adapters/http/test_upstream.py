"""`UpstreamPool` against a real raw-socket HTTP/1.1 server: Content-Length bodies read in one go and
the connection reused, chunked bodies decoded, a body cut short is an `UpstreamError` and the broken
connection is never pooled."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpupool.adapters.http.upstream import UpstreamError, UpstreamPool

BIG = bytes(range(256)) * (16 * 1024)
"""4 MiB: far past the reader's high-water mark and the sockets' buffers together."""
ANSWERS = {
    b"/ok": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello",
    b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    b"/short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    b"/hang": b"",
    b"/eof": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
    b"/slow": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow",
    b"/big": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(BIG), BIG),
    b"/big-eof": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BIG,
    b"/999": b"HTTP/1.1 999 Whatever\r\nContent-Length: 2\r\n\r\n{}",
}
SLOW_S = 0.05
"""``/slow`` is answered after this long."""


@pytest.fixture
def server() -> Iterator[tuple[int, list[int]]]:
    """Answers by path; closes the connection after ``/short``. Counts accepted connections."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    accepted: list[int] = []

    def conn_loop(c: socket.socket) -> None:
        buf = b""
        with c:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = c.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                path = head.split(b" ")[1]
                if path == b"/slow":
                    time.sleep(SLOW_S)
                c.sendall(ANSWERS[path])
                if path in (b"/short", b"/eof", b"/big-eof", b"/999"):
                    return

    def accept_loop() -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=conn_loop, args=(c,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        yield lsock.getsockname()[1], accepted
    finally:
        lsock.close()


async def _refused_then_ok(port: int, path: str, match: str, *, timeout_s: float = 5) -> bytes:
    """Ask ``path`` (an `UpstreamError` matching ``match`` is expected), then ``/ok`` on the same
    pool; returns ``/ok``'s body."""
    pool = UpstreamPool(timeout_s=timeout_s)
    try:
        with pytest.raises(UpstreamError, match=match):
            await pool.request("POST", f"http://127.0.0.1:{port}{path}", content=b"", headers={})
        r = await pool.request("POST", f"http://127.0.0.1:{port}/ok", content=b"", headers={})
        return await r.read()
    finally:
        await pool.aclose()


def test_content_length_body_and_keep_alive_reuse(server: tuple[int, list[int]]) -> None:
    port, accepted = server

    async def go() -> list[bytes]:
        pool = UpstreamPool(timeout_s=5)
        try:
            out = []
            for _ in range(3):
                r = await pool.request("POST", f"http://127.0.0.1:{port}/ok", content=b"{}", headers={})
                assert r.status_code == 200 and r.headers["content-type"] == "application/json"
                out.append(await r.read())
            r = await pool.request("POST", f"http://127.0.0.1:{port}/chunked", content=b"", headers={})
            out.append(await r.read())
            return out
        finally:
            await pool.aclose()

    assert asyncio.run(go()) == [b"hello", b"hello", b"hello", b"abcde"]
    assert len(accepted) == 1  # one connection, reused for every request


def test_body_cut_short_is_an_upstream_error_and_not_pooled(server: tuple[int, list[int]]) -> None:
    port, accepted = server

    async def go() -> bytes:
        pool = UpstreamPool(timeout_s=5)
        try:
            r = await pool.request("POST", f"http://127.0.0.1:{port}/short", content=b"", headers={})
            with pytest.raises(UpstreamError, match="mid-body"):
                await r.read()
            r = await pool.request("POST", f"http://127.0.0.1:{port}/ok", content=b"", headers={})
            return await r.read()
        finally:
            await pool.aclose()

    assert asyncio.run(go()) == b"hello"
    assert len(accepted) == 2  # the cut connection was dropped, a fresh one opened


def test_no_answer_within_the_timeout_is_an_upstream_error_and_not_pooled(
    server: tuple[int, list[int]],
) -> None:
    port, accepted = server
    assert asyncio.run(_refused_then_ok(port, "/hang", "timeout", timeout_s=0.3)) == b"hello"
    assert len(accepted) == 2  # the silent connection was dropped


def test_the_timeout_runs_per_request_on_a_reused_connection(server: tuple[int, list[int]]) -> None:
    """The timeout is a per-connection deadline re-armed lazily: requests that each answer within
    it never time out however long the connection lives, and one that does not still times out
    after the timer has fired early (and re-armed) several times."""
    port, accepted = server

    async def go() -> list[bytes]:
        pool = UpstreamPool(timeout_s=0.5)
        out = []
        try:
            for _ in range(16):  # 16 x 0.05 s on one connection: past the first timer's due time
                r = await pool.request("POST", f"http://127.0.0.1:{port}/slow", content=b"", headers={})
                out.append(await r.read())
            with pytest.raises(UpstreamError, match="timeout"):
                await pool.request("POST", f"http://127.0.0.1:{port}/hang", content=b"", headers={})
        finally:
            await pool.aclose()
        return out

    assert asyncio.run(go()) == [b"slow"] * 16
    assert len(accepted) == 1


def test_a_body_framed_by_the_connections_end_is_read_whole(server: tuple[int, list[int]]) -> None:
    port, _ = server

    async def go() -> list[bytes]:
        pool = UpstreamPool(timeout_s=5)
        try:
            r = await pool.request("POST", f"http://127.0.0.1:{port}/eof", content=b"", headers={})
            return [c async for c in r.aiter_raw()]
        finally:
            await pool.aclose()

    assert b"".join(asyncio.run(go())) == b"until the end"


def test_a_complete_body_larger_than_the_high_water_mark_is_read_whole(
    server: tuple[int, list[int]],
) -> None:
    """`read` (a non-streamed answer: a large embeddings batch, n > 1) waited for the body's end
    while the socket stayed paused at `HIGH_WATER_BYTES` buffered, so a body past it plus the
    sockets' buffers never ended: the request hung, holding its lease, until the client left."""
    port, accepted = server

    async def go() -> list[bytes]:
        pool = UpstreamPool(timeout_s=5)
        try:
            out = []
            for path in ("/big", "/big", "/ok", "/big-eof"):
                r = await pool.request("POST", f"http://127.0.0.1:{port}{path}", content=b"", headers={})
                out.append(await asyncio.wait_for(r.read(), 60))  # (a hang fails here, not the suite)
            return out
        finally:
            await pool.aclose()

    assert asyncio.run(go()) == [BIG, BIG, b"hello", BIG]
    assert len(accepted) == 1  # each whole body left the connection reusable


def test_a_status_outside_100_599_is_an_upstream_error_and_not_pooled(server: tuple[int, list[int]]) -> None:
    """A backend answering ``999`` is broken (the proxy answers 502), not a status to pass on: a client
    library has no meaning for it, and some refuse the response outright."""
    port, accepted = server
    assert asyncio.run(_refused_then_ok(port, "/999", "status 999")) == b"hello"
    assert len(accepted) == 2
