"""`gpupool.adapters.store.etcd_aio`'s response reader on the shapes Go's ``net/http`` answers with:
a body by ``Content-Length``, a chunked body (with and without trailers), ``Connection: close``,
an HTTP/1.0 answer and a body running to the end of the connection; a bad status line is an error."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.adapters.store.etcd_aio import _read_response


def read(raw: bytes) -> tuple[int, bytes, bool]:
    async def go() -> tuple[int, bytes, bool]:
        r = asyncio.StreamReader()
        r.feed_data(raw)
        r.feed_eof()
        return await _read_response(r)

    return asyncio.run(go())


def test_content_length_body_and_keep_alive() -> None:
    raw = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}EXTRA'
    assert read(raw) == (200, b'{"ok":true}', True)


def test_chunked_body_with_and_without_trailers() -> None:
    body = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3;x=y\r\n:1}\r\n0\r\n'
    assert read(body + b"\r\n") == (200, b'{"a":1}', True)
    assert read(body + b"Grpc-Status: 0\r\n\r\n") == (200, b'{"a":1}', True)


def test_connection_close_http10_and_body_to_eof() -> None:
    assert read(b"HTTP/1.1 400 Bad\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}") == (
        400,
        b"{}",
        False,
    )
    assert read(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}") == (200, b"{}", False)
    assert read(b'HTTP/1.1 200 OK\r\n\r\n{"x":1}') == (200, b'{"x":1}', False)


def test_a_bad_status_line_or_a_cut_body_is_an_error() -> None:
    with pytest.raises(ValueError, match="status line"):
        read(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(asyncio.IncompleteReadError):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
