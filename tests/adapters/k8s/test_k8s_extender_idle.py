"""The extender's HTTP server closes connections that stall: one that never sends a request, and
one whose request stops half-way (a body shorter than its Content-Length). Each such connection
used to hold one of the server's threads for ever. The server still answers after them. At most
``max_connections`` connections are served at once: the next one is answered 503 (kube-scheduler
retries), where each connection used to start a thread of its own, without limit."""

from __future__ import annotations

import select
import socket
import time

import pytest
from tests.adapters.k8s.k8s_helpers import make_pool

from gpupool.adapters.k8s.extender import Extender, ExtenderServer

CLOSE_BOUND_S = 20.0  # generous bound on waiting for the close: not a timing claim


def _read_until_closed(s: socket.socket) -> bytes | None:
    """What the server sent before closing ``s``; None if it did not close it within the bound."""
    got = b""
    deadline = time.monotonic() + CLOSE_BOUND_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], 0.2)
        if ready:
            try:
                data = s.recv(4096)
            except ConnectionError:
                return got
            if not data:
                return got
            got += data
    return None


def test_stalled_connections_are_closed_and_the_server_still_answers() -> None:
    server = ExtenderServer(Extender(make_pool()), idle_timeout_s=0.5).start()
    try:
        silent = socket.create_connection(("127.0.0.1", server.port))
        stalled = socket.create_connection(("127.0.0.1", server.port))
        with silent, stalled:
            stalled.sendall(b'POST /filter HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{"Pod":')
            assert _read_until_closed(silent) == b""
            answer = _read_until_closed(stalled)
            assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
        with socket.create_connection(("127.0.0.1", server.port), timeout=CLOSE_BOUND_S) as s:
            s.sendall(b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 ")
    finally:
        server.stop()


def test_connections_past_the_limit_are_answered_503_until_one_ends() -> None:
    server = ExtenderServer(Extender(make_pool()), max_connections=3).start()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        for s in idle:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")  # a head that never ends
        with socket.create_connection(("127.0.0.1", server.port), timeout=CLOSE_BOUND_S) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            answer = _read_until_closed(s)
            assert answer is not None and answer.startswith(b"HTTP/1.1 503 "), answer
            assert b"Retry-After: 1" in answer and b"3 connections" in answer
        for s in idle:
            s.close()
        deadline = time.monotonic() + CLOSE_BOUND_S  # their threads see the close and end
        while True:
            with socket.create_connection(("127.0.0.1", server.port), timeout=CLOSE_BOUND_S) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                answer = _read_until_closed(s)
            if not (answer or b"").startswith(b"HTTP/1.1 503 ") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert answer is not None and answer.startswith(b"HTTP/1.1 200 "), answer
    finally:
        for s in idle:
            s.close()
        server.stop()


@pytest.mark.parametrize("length", [b"abc", b"1e3", b"-1", b"99999999999999999999"])
def test_a_bad_content_length_is_a_400_that_closes_the_connection(length: bytes) -> None:
    """A Content-Length that is not a number was an HTTP 500 (a ValueError from ``int``); with any
    refused Content-Length the body stayed unread on a kept-alive connection, to be read as the next
    request. Now: 400 naming the header, and the server closes the connection."""
    server = ExtenderServer(Extender(make_pool())).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=CLOSE_BOUND_S) as s:
            head = b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Length: " + length + b"\r\n\r\n"
            s.sendall(head + b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            answer = _read_until_closed(s)
        assert answer is not None and answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"Content-Length" in answer and answer.count(b"HTTP/1.1 ") == 1, answer
    finally:
        server.stop()
