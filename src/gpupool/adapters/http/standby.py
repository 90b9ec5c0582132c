"""`StandbyApp`: what a standby replica serves while another replica leads (raw ASGI, no framework).

Several ``gpupool serve`` replicas share one etcd; one leads (owns the ledger and grants), the
others stand by. Clients (SDKs, agents, device plugins, kube-scheduler) are given one address (a
Kubernetes Service, a load balancer, DNS) that may land on any replica, so a standby must give
the same answers the leader would:

- ``GET /healthz`` (and HEAD): the standby's own health, ``{"ok": true, "role": "standby", "leader": URL}``
  (a standby is ready: it can serve, by forwarding);
- ``GET /v1/leases`` and ``GET /v1/leases/{id}``: answered from the standby's watch-fed view of the
  store (`gpupool.adapters.store.etcd_follower`), with the same auth and tenant scoping and the
  same JSON as the leader, ``device_state`` included (node agents report it to the leader, which
  keeps it in the store's meta key ``device_states`` whenever it changes; the view follows that
  key). The view may lag the leader by a watch round trip; a lease id the view
  does not hold yet is forwarded (so a client reading its own new lease never gets a false 404);
- ``GET /metrics``: the standby's own few series (``gpupool_ha_standby 1``, forwarded and answered
  counts), never the leader's: a scrape of every pod must count the ledger once;
- everything else (every write, ticket long-polls, ``/v1/events`` streams, the OpenAI proxy) is
  *forwarded* to the leader over HTTP and its answer streamed back unchanged.

Why a forwarding proxy and not ``307 Temporary Redirect``: a redirect needs every client to reach
every replica's own address (pod IPs behind a Service often are not reachable from outside the
cluster), and most clients do not follow redirects for POST/DELETE (httpx and the OpenAI SDK do
not by default; kube-scheduler's extender client and the device plugin do not at all). Forwarding
costs one extra hop on a standby and nothing on the leader.

Invariants:
- a standby never changes the ledger itself: it has no controller; writes only reach the store
  through the leader (and the store fences out a replica that does not lead);
- a request that cannot be forwarded (no leader elected now, the leader is this very replica and
  still starting, a forwarding loop, or the leader unreachable or failing mid-answer) gets
  ``503`` with ``Retry-After`` and code ``no_leader`` / ``leader_unreachable``: always a
  retryable error, never a guess. A forwarded write whose answer was lost may or may not have
  landed; it is reported as ``503 leader_unreachable`` (the lease API's writes are safe to retry
  in that sense: a duplicate acquire is a second lease that expires with its TTL, a release is
  idempotent);
- a forwarded request carries ``x-gpupool-forwarded-by``; a replica that receives one while not
  leading answers 503 instead of forwarding again (no loops between two standbys whose views of
  the leader differ for a moment).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from gpupool.adapters.http.auth import Principal, TokenTable
from gpupool.adapters.http.context import DEVICE_STATES_META, Gateway, parse_device_states
from gpupool.adapters.http.disconnect import disconnected
from gpupool.adapters.http.upstream import UpstreamError, UpstreamPool
from gpupool.adapters.http.views import lease_json
from gpupool.core.model import Lease

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

FORWARDED_BY = "x-gpupool-forwarded-by"
ROLE_HEADER = "x-gpupool-role"
KV_PREFIX = "kv/"  # (the core's KV budget slice ids: `gpupool.core.kvbackends.KV_PREFIX`)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "host",
        "expect",
    }
)
MAX_FORWARD_BODY_BYTES = 33 * 1024 * 1024
"""Above the leader's own limits (1 MiB lease API, 32 MiB proxy): the leader answers the 413."""


class LeaseView(Protocol):
    """What a standby reads: the follower's view of the store."""

    def get(self, lease_id: str) -> Lease | None: ...

    def leases(self, *, tenant: str | None = None) -> list[Lease]: ...

    def meta(self, key: str) -> str | None: ...


@dataclass
class _ViewController:
    """The two things `lease_json` asks of a controller, answered from the lease alone."""

    def backend_of(self, lease: Lease) -> Any:
        sid = lease.slice_ids[0] if lease.grants else ""
        return _BackendId(sid[len(KV_PREFIX) :]) if sid.startswith(KV_PREFIX) else None


@dataclass(frozen=True)
class _BackendId:
    id: str


class _ViewGateway:
    """What `lease_json` reads of a gateway, from the view: ``device_states`` is the leader's, as
    it last wrote it to the store (`DEVICE_STATES_META`), parsed again only when it changed."""

    def __init__(self, view: LeaseView) -> None:
        self.controller = _ViewController()
        self._view = view
        self._text: str | None = None
        self._states: dict[str, dict[str, str]] = {}

    @property
    def device_states(self) -> dict[str, dict[str, str]]:
        text = self._view.meta(DEVICE_STATES_META)
        if text != self._text:
            self._text, self._states = text, parse_device_states(text)
        return self._states


class StandbyApp:
    def __init__(
        self,
        *,
        view: LeaseView,
        tokens: TokenTable,
        leader_url: Callable[[], str | None],
        self_url: str,
        timeout_s: float = 300.0,
    ) -> None:
        """``leader_url``: the leading replica's base URL now (None: none elected); ``self_url``:
        this replica's own advertised URL (a request is never forwarded to it)."""
        self.view = view
        self.tokens = tokens
        self.leader_url = leader_url
        self.self_url = self_url.rstrip("/")
        self.upstream = UpstreamPool(timeout_s=timeout_s, connect_timeout_s=2.0)
        self._gw = cast(Gateway, _ViewGateway(view))
        self.forwarded = 0
        self.answered = 0
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self.upstream)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if method in ("GET", "HEAD") and path == "/healthz":
            await _json(send, 200, {"ok": True, "role": "standby", "leader": self.leader_url() or ""})
            return
        if method in ("GET", "HEAD") and path == "/metrics":
            await _metrics(send, self.forwarded, self.answered)
            return
        reads = method == "GET" and (path == "/v1/leases" or path.startswith("/v1/leases/"))
        if reads and await self._read(scope, send, path):
            return
        await self._forward(scope, receive, send)

    # ------------------------------------------------------------------ reads from the view
    def _principal(self, scope: Scope) -> Principal | None:
        for k, v in scope["headers"]:
            if k == b"authorization":
                h = v.decode("latin-1")
                return self.tokens.lookup(h[7:].strip()) if h.lower().startswith("bearer ") else None
        return None

    async def _read(self, scope: Scope, send: Send, path: str) -> bool:
        """Answer a lease read from the view; False: forward it (unknown id, auth to be refused,
        a query string or a sub-path the view does not answer)."""
        who = self._principal(scope)
        if who is None or scope.get("query_string"):
            return False  # (the leader answers 401 with its exact body)
        tenant = None if who.is_admin else who.tenant
        if path == "/v1/leases":
            body = {"leases": [lease_json(self._gw, x) for x in self.view.leases(tenant=tenant)]}
            await _json(send, 200, body)
            self.answered += 1
            return True
        lease_id = path[len("/v1/leases/") :]
        if not lease_id or "/" in lease_id:
            return False
        x = self.view.get(lease_id)
        if x is None or (tenant is not None and x.request.tenant != tenant):
            return False
        await _json(send, 200, lease_json(self._gw, x))
        self.answered += 1
        return True

    # ------------------------------------------------------------------ forwarding
    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        leader = (self.leader_url() or "").rstrip("/")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not leader or leader == self.self_url or FORWARDED_BY in headers:
            why = "no leader is elected now" if not leader else "the leader is starting"
            await _unavailable(send, "no_leader", why)
            return
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > MAX_FORWARD_BODY_BYTES:
                await _json(send, 413, {"error": "request body too large", "code": "body_too_large"})
                return
            if not msg.get("more_body", False):
                break
        fwd = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
        fwd[FORWARDED_BY] = self.self_url
        qs = scope.get("query_string", b"")
        url = leader + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if qs:
            url += "?" + qs.decode("latin-1")
        started: list[bool] = []
        talk = self._exchange(scope["method"], url, bytes(body), fwd, send=send, started=started)
        exchange = asyncio.create_task(talk)
        gone = asyncio.create_task(disconnected(receive))
        changed = asyncio.create_task(self._changed.wait())
        why = ""
        try:
            done, _ = await asyncio.wait((exchange, gone, changed), return_when=asyncio.FIRST_COMPLETED)
            if exchange not in done:
                # the client left (e.g. closed an event stream), or the leader changed (a forward to a
                # leader that was paused or cut off would hang): stop, answer 503 if nothing was sent
                why = "the leader changed" if changed in done else ""
        except asyncio.CancelledError:
            why = "this replica is switching roles"  # (its server stops; the client retries)
        finally:
            for t in (exchange, gone, changed):
                t.cancel()
            results = await asyncio.gather(exchange, gone, changed, return_exceptions=True)
        if why and not started:
            await _unavailable(send, "leader_unreachable", f"{why} while forwarding to {leader}; retry")
            return
        if isinstance(results[0], UpstreamError):
            raise results[0]  # mid-stream: end the connection (a cut answer, never a wrong one)

    def leader_changed(self) -> None:
        """The leader key changed: forwards in flight end (503 when no answer was started yet).
        Callable from any thread (the follower's watch thread calls it)."""
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._changed.set()
            self._changed = asyncio.Event()
        else:
            loop.call_soon_threadsafe(self.leader_changed)

    async def _exchange(
        self, method: str, url: str, body: bytes, headers: dict[str, str], *, send: Send, started: list[bool]
    ) -> None:
        leader = url.split("/", 3)[2]
        try:
            resp = await self.upstream.request(method, url, content=body, headers=headers)
        except UpstreamError as exc:
            started.append(True)
            await _unavailable(send, "leader_unreachable", f"cannot reach the leader {leader}: {exc}")
            return
        out = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items() if k not in HOP_BY_HOP
        ]
        out.append((ROLE_HEADER.encode(), b"standby"))
        self.forwarded += 1
        try:
            async for chunk in resp.aiter_raw():
                if not started:
                    started.append(True)
                    await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            if started:
                raise
            started.append(True)
            await _unavailable(send, "leader_unreachable", f"the leader {leader} failed: {exc}")
            return
        if not started:
            started.append(True)
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class LeaderOnly:
    """The leader's own app, answering ``503 no_leader`` once ``is_leader()`` is False (a leader
    woken after a pause past its TTL, in the moment before it exits): it never answers from a
    ledger that another replica may have changed since. ``state`` is the wrapped app's (the server
    set-up reads the gateway from it)."""

    def __init__(self, app: Any, is_leader: Callable[[], bool]) -> None:
        self.app = app
        self.is_leader = is_leader
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.is_leader():
            await _unavailable(send, "no_leader", "this replica no longer leads; retry")
            return
        await self.app(scope, receive, send)


async def _json(send: Send, status: int, doc: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(doc, separators=(",", ":")).encode()
    h = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    h.append((ROLE_HEADER.encode(), b"standby"))
    await send({"type": "http.response.start", "status": status, "headers": h + (headers or [])})
    await send({"type": "http.response.body", "body": data})


async def _metrics(send: Send, forwarded: int, answered: int) -> None:
    """A standby's own metrics only: the leader's series come from the leader alone (a scrape of
    every pod behind the Service must not count the ledger three times)."""
    data = (
        "# HELP gpupool_ha_standby 1 on a standby replica (the leader exports the ledger's series).\n"
        "# TYPE gpupool_ha_standby gauge\ngpupool_ha_standby 1\n"
        "# HELP gpupool_ha_forwarded_total Requests this standby forwarded to the leader.\n"
        f"# TYPE gpupool_ha_forwarded_total counter\ngpupool_ha_forwarded_total {forwarded}\n"
        "# HELP gpupool_ha_answered_total Lease reads this standby answered from its view.\n"
        f"# TYPE gpupool_ha_answered_total counter\ngpupool_ha_answered_total {answered}\n"
    ).encode()
    h = [
        (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
        (b"content-length", str(len(data)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": h})
    await send({"type": "http.response.body", "body": data})


async def _unavailable(send: Send, code: str, why: str) -> None:
    doc = {"error": why, "code": code, "retry_after_s": 1.0}
    await _json(send, 503, doc, [(b"retry-after", b"1"), (b"x-gpupool-dropped-reason", code.encode())])


async def _lifespan(receive: Receive, send: Send, upstream: UpstreamPool) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await upstream.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return


__all__ = ["FORWARDED_BY", "ROLE_HEADER", "LeaderOnly", "LeaseView", "StandbyApp"]
