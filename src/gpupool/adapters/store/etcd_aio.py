"""`AsyncGateway`: etcd's JSON gateway from an asyncio event loop, for pipelined group commits.

Role: `EtcdLeaseStore.apply_async` sends a group commit's Txn through this, so that the gateway's
event loop keeps serving requests while etcd fsyncs, and several commits can be in flight at once
(etcd folds concurrent raft proposals into one fsync). Everything else (reads, watch, leases,
compaction, auth) stays on the synchronous `gpupool.adapters.store.etcd_client.EtcdClient`, whose
endpoints, TLS context and auth token this reuses.

Why a hand-written HTTP/1.1 exchange: the only request is ``POST /v3/kv/txn`` with a JSON body, and
the answer is one Go ``net/http`` response (``Content-Length`` or chunked); ``http.client`` blocks,
the gateway's own upstream client lives in another adapter (adapters may not import each other),
and a general client (httpx) cost ~3x the CPU per call (measured, see `gpupool.adapters.store.etcd`).
The parser below reads exactly that: a status line, headers, a body by length or by chunks.

Invariants:
- each in-flight request has a keep-alive connection of its own (opened on demand, at most
  ``idle_max`` kept idle), so requests never queue behind each other on one connection;
- a request is retried (on a new connection, then on the other endpoints) only when nothing of it
  was written: a connection that fails to open, or an idle one found closed before writing. Once
  written, a failure (reset, EOF, ``timeout_s`` without an answer) raises `EtcdError` with code
  UNAVAILABLE: the outcome is unknown, and the caller treats it as such;
- an "invalid auth token" answer re-authenticates once (on the synchronous client) and resends:
  etcd refused the request, so nothing of it landed;
- etcd's error answers raise `EtcdError` with etcd's gRPC code and message, like `EtcdClient.call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any
from urllib.parse import urlsplit

from gpupool.adapters.store.etcd_client import GRPC_UNAUTHENTICATED, GRPC_UNAVAILABLE, EtcdClient, EtcdError

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AsyncGateway:
    def __init__(self, client: EtcdClient) -> None:
        self.client = client
        self._conn: tuple[int, _Conn] | None = None
        self._reading: asyncio.Lock | None = None
        """Answers are read in the order the requests were written (HTTP/1.1 pipelining)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the connection belongs to (a call from another loop opens its own)."""

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path``; etcd's answer as a dict (see the module docstring for errors)."""
        data = json.dumps(body).encode()
        retried_auth = False
        while True:
            status, payload = await self._post(path, data)
            try:
                doc = json.loads(payload)
            except ValueError:
                raise EtcdError(f"etcd {path}: HTTP {status}: {payload[:200]!r}") from None
            if status == 200 and "error" not in doc:
                return dict(doc)
            code = int(doc.get("code", GRPC_UNAVAILABLE))
            message = str(doc.get("message") or doc.get("error") or payload[:200])
            c = self.client
            if (
                (code == GRPC_UNAUTHENTICATED or "invalid auth token" in message)
                and c._user is not None
                and not retried_auth
            ):
                retried_auth = True
                c._authenticate()  # (rare: blocks the loop for one round trip)
                continue
            raise EtcdError(f"etcd {path}: {message}", code=code)

    async def _post(self, path: str, data: bytes) -> tuple[int, bytes]:
        c = self.client
        n = len(c.urls)
        errors: list[str] = []
        if self._loop is not asyncio.get_running_loop():
            self._drop()
        for i in range(n + 1):  # the current endpoint twice (a connection found closed), then the others
            at = (c._current + max(0, i - 1)) % n
            conn = self._conn[1] if self._conn is not None and self._conn[0] == at else None
            if conn is not None and (conn[0].at_eof() or conn[1].is_closing()):
                self._drop()  # closed by the server while idle: nothing was sent on it
                conn = None
            if conn is None:
                self._drop()
                try:
                    conn = await self._connect(at)
                except OSError as exc:  # nothing was sent: the next endpoint
                    errors.append(f"{c.urls[at]}: {exc or type(exc).__name__}")
                    continue
                if self._conn is not None:  # (another call connected meanwhile: use that one)
                    conn[1].close()
                    conn = self._conn[1]
                else:
                    self._conn, self._reading = (at, conn), asyncio.Lock()
                    self._loop = asyncio.get_running_loop()
            reader, writer = conn
            reading = self._reading
            assert reading is not None
            try:
                writer.write(self._head(at, path, len(data)) + data)
                async with asyncio.timeout(c.timeout_s), reading:
                    status, payload, keep = await _read_response(reader)
            except (OSError, EOFError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
                if self._conn is not None and self._conn[1] is conn:
                    self._drop()  # (every request pipelined on it fails the same way)
                raise EtcdError(
                    f"etcd {path}: no answer from {c.urls[at]} ({exc or type(exc).__name__}):"
                    " the outcome is unknown",
                    code=GRPC_UNAVAILABLE,
                ) from None
            c._current = at
            if not keep and self._conn is not None and self._conn[1] is conn:
                self._drop()
            return status, payload
        raise EtcdError(f"no etcd endpoint answered ({'; '.join(errors)})")

    def _head(self, at: int, path: str, length: int) -> bytes:
        host = urlsplit(self.client.urls[at]).netloc
        auth = "".join(f"{k}: {v}\r\n" for k, v in self.client._headers().items())
        return (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{auth}\r\n"
        ).encode()

    async def _connect(self, at: int) -> _Conn:
        u = urlsplit(self.client.urls[at])
        ctx = self.client.ssl_context if u.scheme == "https" else None
        async with asyncio.timeout(self.client.timeout_s):
            reader, writer = await asyncio.open_connection(
                u.hostname or "127.0.0.1", u.port or 2379, ssl=ctx, limit=1 << 22
            )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(RuntimeError):  # (its loop already closed: nothing to do)
                self._conn[1][1].close()
        self._conn = self._reading = self._loop = None

    def close(self) -> None:
        self._drop()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 response: (status, body, whether the connection may be reused)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    status = int(parts[1])
    length = -1
    chunked = False
    keep = parts[0] == "HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value
        elif name == "connection":
            keep = value != "close"
    if chunked:
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                    pass
                return status, bytes(body), keep
            body += (await reader.readexactly(size + 2))[:-2]
    if length < 0:  # (no length, not chunked: the body runs to the end of the connection)
        return status, await reader.read(), False
    return status, await reader.readexactly(length), keep


__all__ = ["AsyncGateway"]
