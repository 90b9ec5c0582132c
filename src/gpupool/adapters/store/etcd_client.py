"""A small synchronous etcd v3 client on etcd's JSON gRPC gateway (``/v3/...``), standard library only
(``http.client`` keep-alive connections; measured 1.6 ms of client CPU per one-write Txn with httpx,
see `gpupool.adapters.store.etcd`).

Role: the few etcd calls the stores need (range, put, delete, txn, lease grant/keep-alive/revoke,
watch, compaction, auth), nothing more; `gpupool.adapters.store.etcd` says why this and not another
client library.

Invariants:
- keys and values are ``bytes`` on this API and base64 on the wire (the gateway's proto3 JSON form);
  every 64-bit integer is sent as a JSON string and parsed back with ``int``; fields at their proto
  zero value are absent from answers and read as 0 / empty;
- a request goes to the current endpoint; on a transport error (refused, reset, a keep-alive
  connection the server closed) it is tried again on the same endpoint once, then on each other
  endpoint once (a cluster keeps answering while one member is down). Retrying a write is safe: a
  Txn whose first try landed fails its compare on the second (a conflict, never a double write) and
  plain puts are idempotent. An etcd error answer is never retried here: it raises `EtcdError`
  with etcd's gRPC code and message;
- with ``user``/``password`` the client authenticates once (``/v3/auth/authenticate``) and sends the
  token in the ``Authorization`` header; an "invalid auth token" answer re-authenticates once;
- one client object may be used from several threads: each thread has its own keep-alive
  connection per endpoint; a `Watch` runs its stream in a thread of its own, on a connection of
  its own.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpupool.core.errors import StoreUnreachable


class EtcdError(StoreUnreachable):
    """etcd answered with an error (``code`` is the gRPC status code) or no endpoint answered."""

    def __init__(self, message: str, *, code: int = 14) -> None:
        self.code = code
        super().__init__(message)


GRPC_UNAVAILABLE = 14
GRPC_INVALID_ARGUMENT = 3
GRPC_FAILED_PRECONDITION = 9
GRPC_PERMISSION_DENIED = 7
GRPC_OUT_OF_RANGE = 11  # e.g. "mvcc: required revision has been compacted"
GRPC_UNAUTHENTICATED = 16


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix``."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KeyValue:
        return cls(
            key=unb64(d.get("key")),
            value=unb64(d.get("value")),
            create_revision=int(d.get("create_revision", 0)),
            mod_revision=int(d.get("mod_revision", 0)),
            version=int(d.get("version", 0)),
            lease=int(d.get("lease", 0)),
        )


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change: ``put`` (``kv`` is the new value) or ``delete`` (``kv.value`` is empty)."""

    kind: str
    kv: KeyValue


def range_op(key: bytes, range_end: bytes | None = None) -> dict[str, Any]:
    """A txn operation reading ``[key, range_end)`` (one key when ``range_end`` is None)."""
    body = {"key": b64(key)}
    if range_end is not None:
        body["range_end"] = b64(range_end)
    return {"request_range": body}


def put_op(key: bytes, value: bytes, *, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def compare(key: bytes, target: str, value: int) -> dict[str, Any]:
    """``target`` (VERSION | CREATE | MOD | LEASE) of ``key`` EQUAL to ``value``."""
    field = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[
        target
    ]
    return {"target": target, "key": b64(key), "result": "EQUAL", field: str(value)}


def compare_value(key: bytes, value: bytes) -> dict[str, Any]:
    """The value of ``key`` EQUAL to ``value`` (false when ``key`` does not exist)."""
    return {"target": "VALUE", "key": b64(key), "result": "EQUAL", "value": b64(value)}


class _NoDelay(http.client.HTTPConnection):
    """``http.client`` sends a request's head and body in two writes; with Nagle's algorithm on, the
    body waits for the server's (delayed) ACK of the head. TCP_NODELAY sends both at once."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayTls(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(url: str, context: ssl.SSLContext | None, timeout_s: float | None) -> http.client.HTTPConnection:
    """A (lazily connecting) HTTP/1.1 connection to ``url`` (``http://`` or ``https://`` with
    ``context``), with TCP_NODELAY (`_NoDelay`)."""
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 2379
    if u.scheme == "https":
        return _NoDelayTls(host, port, timeout=timeout_s, context=context)
    return _NoDelay(host, port, timeout=timeout_s)


class EtcdClient:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: bool = False,
        cacert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        """``endpoints``: ``host:port`` of each member. TLS when ``tls`` or any of cacert/cert/key is set."""
        if not endpoints:
            raise EtcdError("no etcd endpoint given", code=GRPC_INVALID_ARGUMENT)
        scheme = "https" if (tls or cacert or cert or key) else "http"
        self.urls = [f"{scheme}://{e}" for e in endpoints]
        self._current = 0
        self.timeout_s = timeout_s
        self.ssl_context: ssl.SSLContext | None = None
        self.tls_files: tuple[str | None, str | None, str | None] | None = None
        """(cacert, cert, key) when TLS is on (for a gRPC channel to the same endpoints)."""
        if scheme == "https":
            self.tls_files = (cacert, cert, key)
            self.ssl_context = ssl.create_default_context(cafile=cacert)
            if cert:
                self.ssl_context.load_cert_chain(cert, key)
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []
        self._user = user
        self._password = password
        self._token: str | None = None
        self._lock = threading.Lock()
        if user is not None:
            self._authenticate()

    # ------------------------------------------------------------------ transport
    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    def _authenticate(self) -> None:
        self._token = None
        out = self.call("/v3/auth/authenticate", {"name": self._user, "password": self._password or ""})
        self._token = str(out["token"])

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first endpoint that answers; etcd's answer as a dict."""
        retried_auth = False
        while True:
            status, payload = self._post(path, json.dumps(body).encode())
            try:
                doc = json.loads(payload)
            except ValueError:
                raise EtcdError(f"etcd {path}: HTTP {status}: {payload[:200]!r}") from None
            if status == 200 and "error" not in doc:
                return dict(doc)
            code = int(doc.get("code", GRPC_UNAVAILABLE))
            message = str(doc.get("message") or doc.get("error") or payload[:200])
            if (
                (code == GRPC_UNAUTHENTICATED or "invalid auth token" in message)
                and self._user is not None
                and not retried_auth
                and path != "/v3/auth/authenticate"
            ):
                retried_auth = True
                self._authenticate()
                continue
            raise EtcdError(f"etcd {path}: {message}", code=code)

    def _connection(self, at: int) -> http.client.HTTPConnection:
        conns: dict[int, http.client.HTTPConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(at)
        if conn is None:
            conn = conns[at] = connect(self.urls[at], self.ssl_context, self.timeout_s)
            with self._lock:
                self._opened.append(conn)
        return conn

    def _post(self, path: str, data: bytes) -> tuple[int, bytes]:
        errors = []
        n = len(self.urls)
        headers = {"Content-Type": "application/json", **self._headers()}
        for i in range(n + 1):  # the current endpoint twice (a stale keep-alive connection), then the others
            at = (self._current + max(0, i - 1)) % n
            conn = self._connection(at)
            try:
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()  # (the next request on it connects again)
                errors.append(f"{self.urls[at]}: {exc or type(exc).__name__}")
                continue
            if resp.will_close:
                conn.close()
            self._current = at
            return resp.status, payload
        raise EtcdError(f"no etcd endpoint answered ({'; '.join(errors)})")

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()

    # ------------------------------------------------------------------ KV
    def range(
        self, key: bytes, range_end: bytes | None = None, *, revision: int = 0
    ) -> tuple[list[KeyValue], int]:
        """The key-values in ``[key, range_end)`` sorted by key, and the store revision they are from."""
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        if revision:
            body["revision"] = str(revision)
        out = self.call("/v3/kv/range", body)
        return [KeyValue.from_json(kv) for kv in out.get("kvs", ())], int(out["header"]["revision"])

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        out = self.call("/v3/kv/put", put_op(key, value, lease=lease)["request_put"])
        return int(out["header"]["revision"])

    def txn(
        self,
        compares: Sequence[dict[str, Any]],
        success: Sequence[dict[str, Any]],
        failure: Sequence[dict[str, Any]] = (),
    ) -> tuple[bool, list[dict[str, Any]], int]:
        """One transaction: (succeeded, the responses of the branch taken, the revision after it)."""
        out = self.call(
            "/v3/kv/txn", {"compare": list(compares), "success": list(success), "failure": list(failure)}
        )
        return (
            bool(out.get("succeeded", False)),
            list(out.get("responses", ())),
            int(out["header"]["revision"]),
        )

    def revision(self, key: bytes = b"\0") -> int:
        """The store's current revision (from a read of ``key``: pick one the user may read)."""
        return self.range(key)[1]

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (watchers that need it get "compacted")."""
        self.call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    # ------------------------------------------------------------------ leases (etcd's, for election)
    def lease_grant(self, ttl_s: int) -> int:
        out = self.call("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(out["ID"])

    def lease_keepalive(self, lease_id: int) -> int:
        """Renew ``lease_id``; its remaining TTL in seconds (0: it had already expired)."""
        out = self.call("/v3/lease/keepalive", {"ID": str(lease_id)})
        return int(out.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease_id: int) -> None:
        self.call("/v3/lease/revoke", {"ID": str(lease_id)})

    # ------------------------------------------------------------------ watch
    def watch(
        self,
        key: bytes,
        range_end: bytes | None,
        *,
        start_revision: int,
        on_events: Callable[[list[WatchEvent], int], None],
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Watch:
        """Follow ``[key, range_end)`` from ``start_revision`` in a thread: ``on_events(events, revision)``
        per answer, in revision order; ``on_error`` once if the stream fails (then the watch stops)."""
        w = Watch(self, key, range_end, start_revision=start_revision, on_events=on_events, on_error=on_error)
        w.start()
        return w


class Watch:
    """One watch stream (see `EtcdClient.watch`) on an ``http.client`` connection of its own (so that
    `cancel` can shut its socket down and wake the reading thread at once). A broken stream is
    resumed from the last revision delivered + 1, on the next endpoint, for up to ``RETRY_S``
    seconds of failures in a row (an etcd member restarting, a leader election); then ``on_error`` is
    called once and the watch stops."""

    RETRY_S = 10.0

    def __init__(
        self,
        client: EtcdClient,
        key: bytes,
        range_end: bytes | None,
        *,
        start_revision: int,
        on_events: Callable[[list[WatchEvent], int], None],
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self._client = client
        self._create: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            self._create["range_end"] = b64(range_end)
        self.next_revision = start_revision
        self._on_events = on_events
        self._on_error = on_error
        self._stop = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="gpupool-etcd-watch", daemon=True)
        self._answered = False
        self.created = threading.Event()
        """Set once the server confirmed the watch (or it failed): changes after that are seen."""

    def start(self) -> None:
        self._thread.start()

    def _stream(self) -> None:
        c = self._client
        conn = self._conn = connect(c.urls[c._current], c.ssl_context, None)
        try:
            body = json.dumps({"create_request": {**self._create, "start_revision": str(self.next_revision)}})
            conn.request(
                "POST", "/v3/watch", body=body, headers={"Content-Type": "application/json", **c._headers()}
            )
            resp = conn.getresponse()
            if resp.status != 200:
                raise EtcdError(f"etcd watch: HTTP {resp.status}: {resp.read(200)!r}")
            while not self._stop.is_set():
                line = resp.readline()
                if not line:
                    raise EtcdError("etcd watch: the stream ended")
                if line.strip():
                    self._handle(json.loads(line))
        finally:
            conn.close()

    def _handle(self, doc: dict[str, Any]) -> None:
        if "error" in doc:
            err = doc["error"]
            raise EtcdError(f"etcd watch: {err.get('message')}", code=int(err.get("code", GRPC_UNAVAILABLE)))
        self._answered = True  # (a result: the stream works; an error answer is no progress)
        result = doc.get("result", {})
        if result.get("created"):
            self.created.set()
        if result.get("canceled"):
            reason = result.get("cancel_reason") or "canceled by the server"
            code = GRPC_OUT_OF_RANGE if result.get("compact_revision") else GRPC_UNAVAILABLE
            raise _Fatal(EtcdError(f"etcd watch: {reason}", code=code))
        events = [
            WatchEvent("delete" if e.get("type") == "DELETE" else "put", KeyValue.from_json(e["kv"]))
            for e in result.get("events", ())
        ]
        if events:
            revision = int(result["header"]["revision"])
            self._on_events(events, revision)
            self.next_revision = max(e.kv.mod_revision for e in events) + 1

    def _run(self) -> None:
        failures = 0
        first_failure = 0.0
        try:
            while not self._stop.is_set():
                self._answered = False
                try:
                    self._stream()
                except _Fatal as f:
                    raise f.error from None
                except (OSError, http.client.HTTPException, EtcdError, ValueError) as exc:
                    if self._stop.is_set():
                        return
                    if self._answered:  # the stream had worked: a new streak of failures starts
                        failures = 0
                    failures += 1
                    now = time.monotonic()
                    if failures == 1:
                        first_failure = now
                    elif now - first_failure > self.RETRY_S:
                        raise EtcdError(f"etcd watch: no endpoint for {self.RETRY_S} s: {exc}") from exc
                    c = self._client
                    c._current = (c._current + 1) % len(c.urls)
                    self._stop.wait(min(1.0, 0.1 * failures))
        except BaseException as exc:
            if not self._stop.is_set() and self._on_error is not None:
                self._on_error(exc)
        finally:
            self.created.set()

    def cancel(self) -> None:
        """Stop: no ``on_events`` call starts after this returns."""
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)


class _Fatal(Exception):
    """A watch error that retrying cannot cure (compacted revision, canceled by the server)."""

    def __init__(self, error: EtcdError) -> None:
        self.error = error


__all__ = [
    "GRPC_PERMISSION_DENIED",
    "EtcdClient",
    "EtcdError",
    "KeyValue",
    "Watch",
    "WatchEvent",
    "b64",
    "compare",
    "compare_value",
    "delete_op",
    "prefix_end",
    "put_op",
    "range_op",
    "unb64",
]
