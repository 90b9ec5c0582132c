"""The node agent's ``/metrics`` server (`AgentMetrics.serve`) bounds what clients can hold: at most
``max_connections`` connections are served at once (the next one is answered 503 and closed,
without a thread of its own), and a connection that stops sending is closed. Before, every
connection, even one that never sent a byte, held a thread and a file descriptor for ever."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator

import pytest

from gpupool.adapters.metrics.dcgm import AgentGauges, AgentMetrics

CLOSE_BOUND_S = 20.0  # generous bound on waiting for the server: not a timing claim
GET = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"


def _read_until_closed(s: socket.socket) -> bytes | None:
    """What the server sent before closing ``s``; None if it did not close it within the bound."""
    got = b""
    deadline = time.monotonic() + CLOSE_BOUND_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], 0.2)
        if ready:
            try:
                data = s.recv(65536)
            except ConnectionError:
                return got
            if not data:
                return got
            got += data
    return None


def _get(port: int) -> bytes | None:
    with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_BOUND_S) as s:
        s.sendall(GET)
        return _read_until_closed(s)


@contextlib.contextmanager
def serving(*, idle_timeout_s: float) -> Iterator[int]:
    server, port = AgentMetrics("node-a", lambda: AgentGauges(())).serve(
        host="127.0.0.1", port=0, max_connections=3, idle_timeout_s=idle_timeout_s
    )
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def port() -> Iterator[int]:
    """A server whose idle connections outlive the test (the limit, not the timeout, is tested)."""
    with serving(idle_timeout_s=CLOSE_BOUND_S * 3) as port:
        yield port


def test_connections_past_the_limit_are_answered_503_until_one_ends(port: int) -> None:
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        for s in idle:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # a head that never ends
        answer = _get(port)
        assert answer is not None and answer.startswith(b"HTTP/1.0 503 "), answer
        assert b"3 connections" in answer
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + CLOSE_BOUND_S  # their threads see the close and end
    answer = _get(port)
    while answer is not None and answer.startswith(b"HTTP/1.0 503 ") and time.monotonic() < deadline:
        time.sleep(0.05)
        answer = _get(port)
    assert answer is not None and answer.startswith(b"HTTP/1.0 200 "), answer


def test_a_connection_that_sends_nothing_is_closed() -> None:
    with serving(idle_timeout_s=0.5) as port:
        _stalled_connections_are_closed(port)


def _stalled_connections_are_closed(port: int) -> None:
    silent = socket.create_connection(("127.0.0.1", port))
    stalled = socket.create_connection(("127.0.0.1", port))
    with silent, stalled:
        stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost:")
        assert _read_until_closed(silent) == b""
        assert _read_until_closed(stalled) is not None
    answer = _get(port)
    assert answer is not None and answer.startswith(b"HTTP/1.0 200 "), answer
