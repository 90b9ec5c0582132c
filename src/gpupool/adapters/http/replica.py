"""`create_replica_app`: a *proxy replica*: the OpenAI-compatible proxy (`proxy.add_proxy_routes`, the
same code as the gateway's) in its own process, granting request leases inside the KV shares the
leader delegates to it (`gpupool.core.replica.ProxyReplica`), so no request reaches the leader.

Share calls (`ShareLoop`): ``POST {leader}/v1/kv/shares`` every ``ttl_s / 3``, and at once (at most
every `URGENT_GAP_S`) when a request found no room in the replica's shares; one call in flight at a
time, each bounded by ``ttl_s / 3``; a failed or refused call changes nothing (the shares lapse on
their own when no call succeeds for ``ttl_s``, minus a margin). A failure is logged as one line of
text (the leader's ``error`` field, never a bytes repr); a 401/403 is also kept in
`ShareLoop.refused`, so the CLI can stop at start on a token the leader refuses (an unreachable
leader is retried: it may come up later). Cancelling `ShareLoop.run` always
ends it: the bounds are ``asyncio.timeout`` blocks, not ``asyncio.wait_for``, which on Python 3.11
drops a cancellation that lands as the awaited step completes (the replica then never stopped). On
shutdown the replica gives its shares back (``DELETE /v1/kv/shares/{replica}/{incarnation}``) so
the others can use them at once.

Routes: the proxy's (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``), and ``GET /healthz`` (HEAD too, for monitors): ``{"ok", "replica", "incarnation",
"share_calls", "share_failures", "granted", "waited", "shed", "backends": {id: {"share_mib",
"cap_mib", "used_mib", "leases", "valid"}}}``; ``ok`` is true while at least one share is valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gpupool.adapters.http import errors
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.context import Metrics, Sizer
from gpupool.adapters.http.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROXY_BODY_BYTES, BodyLimit
from gpupool.adapters.http.runtime import EventHub
from gpupool.adapters.http.upstream import UpstreamPool
from gpupool.core.kvshares import ShareGrant
from gpupool.core.ports import Backend
from gpupool.core.replica import ProxyReplica

log = logging.getLogger("gpupool.replica")
URGENT_GAP_S = 0.05
"""Least time between two share calls made because a request found no room."""


class LeaderAnswer(Exception):
    """A share call answered with a status other than 200; ``str()`` is ``HTTP 401: invalid token``
    (the body's ``error`` field, else its first characters as text)."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        try:
            detail = str(json.loads(body)["error"])
        except Exception:  # NOTE: not the gateway's error JSON: show the start of it as text
            detail = body[:200].decode("utf-8", "replace")
        detail = " ".join(detail.split())[:200] or "(empty body)"
        super().__init__(f"HTTP {status}: {detail}")


@dataclass
class ReplicaHost:
    """What the proxy reads of a replica process (`proxyhost.ProxyHost`)."""

    controller: ProxyReplica
    tokens: TokenTable
    hub: EventHub
    sizer: Sizer | None = None
    metrics: Metrics | None = None
    default_max_tokens: int = 256
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


class ShareLoop:
    """The replica's share calls to the leader (see the module docstring)."""

    def __init__(
        self, core: ProxyReplica, *, leader_url: str, token: str, replica: str, ttl_s: float
    ) -> None:
        self.core = core
        self.on_backends: Callable[[dict[str, Any]], None] | None = None
        """Called with the answer's ``backends`` when they change (the proxy's options)."""
        self._seen: dict[str, Any] = {}
        self.url = leader_url.rstrip("/") + "/v1/kv/shares"
        self.headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        self.replica = replica
        self.incarnation = uuid.uuid4().hex[:12]
        self.ttl_s = ttl_s
        self.pool = UpstreamPool(timeout_s=ttl_s / 3, connect_timeout_s=ttl_s / 3)
        self.calls = 0
        self.failures = 0
        self.last_error = ""
        self.refused = ""
        """The last call's refusal (HTTP 401/403) as one line, "" when it was not refused."""

    async def call(self, *, quiet: bool = False) -> bool:
        """One share call; True when its answer was applied. ``quiet``: a refusal is not logged
        (the caller reports `refused` itself)."""
        seq, reports = self.core.share_report()
        body = {
            "replica": self.replica,
            "incarnation": self.incarnation,
            "seq": seq,
            "ttl_s": self.ttl_s,
            "shares": {
                bid: {"hold_mib": r.hold_mib, "used_mib": r.used_mib, "want_mib": r.want_mib}
                for bid, r in reports.items()
            },
        }
        self.calls += 1
        try:
            async with asyncio.timeout(self.ttl_s / 3):
                r = await self.pool.request(
                    "POST", self.url, content=json.dumps(body).encode(), headers=self.headers
                )
            async with asyncio.timeout(self.ttl_s / 3):
                data = await r.read()
            if r.status_code != 200:
                raise LeaderAnswer(r.status_code, data)
            doc = json.loads(data)
            backends = {
                bid: Backend(bid, v["model"], v["url"], v["node"], v["gpu_id"], int(v["kv_budget_mib"]))
                for bid, v in doc["backends"].items()
            }
            grants = {
                bid: ShareGrant(int(v["share_mib"]), int(v["target_mib"])) for bid, v in doc["shares"].items()
            }
            paused = frozenset(bid for bid, v in doc["backends"].items() if v.get("paused"))
        except Exception as exc:  # NOTE: any failure leaves the shares as they are (they lapse alone)
            self.failures += 1
            answer = exc if isinstance(exc, LeaderAnswer) else None
            self.last_error = str(exc) if answer else f"{type(exc).__name__}: {exc}"
            self.refused = self.last_error if answer and answer.status in (401, 403) else ""
            if not (quiet and self.refused):
                log.warning("share call %d to %s failed: %s", seq, self.url, self.last_error)
            return False
        self.refused = ""
        known = set(self.core.lane.backends())
        if doc["backends"] != self._seen and self.on_backends is not None:
            try:
                self.on_backends(doc["backends"])
            except Exception as exc:  # NOTE: bad options must not stop the share calls
                log.warning("backend options from the leader not applied: %s", exc)
            self._seen = doc["backends"]
        ok = self.core.share_answer(seq, float(doc["ttl_s"]), backends, grants, paused)
        if ok and set(backends) - known:
            return await self.call()  # new backends: ask for their shares now, not a period later
        return ok

    async def run(self) -> None:
        period = self.ttl_s / 3
        while True:
            t0 = time.monotonic()
            await self.call()
            await asyncio.sleep(URGENT_GAP_S)
            while time.monotonic() - t0 < period and not self.core.renewal_wanted():
                await asyncio.sleep(0.01)

    async def give_back(self) -> None:
        url = f"{self.url}/{self.replica}/{self.incarnation}"
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                r = await self.pool.request("DELETE", url, content=b"", headers=self.headers)
            async with asyncio.timeout(2.0):
                await r.read()
        await self.pool.aclose()


def create_replica_app(
    core: ProxyReplica,
    loop: ShareLoop,
    *,
    tokens: TokenTable,
    sizer: Sizer | None = None,
    tick_s: float = 0.05,
    proxy_timeout_s: float = 300.0,
    max_proxy_body_bytes: int = DEFAULT_MAX_PROXY_BODY_BYTES,
) -> FastAPI:
    hub = EventHub()
    core.sink = hub
    host = ReplicaHost(core, tokens, hub, sizer)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(tick_s)
            try:
                core.tick()
            except Exception:  # pragma: no cover - never stop ticking
                log.exception("replica tick failed")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(loop.run()), asyncio.create_task(ticker())]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.give_back()
            for close in host.closers:
                await close()
            hub.close()

    app = FastAPI(
        title="gpupool proxy replica", version="1", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.gateway = host
    errors.install(app)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        lane = core.lane
        view: dict[str, Any] = {}
        for bid in sorted(lane.backends()):
            share, cap, used, n = lane.usage(bid)
            view[bid] = {"share_mib": share, "cap_mib": cap, "used_mib": used, "leases": n}
            view[bid]["valid"] = lane.valid(bid)
        doc = {
            "ok": any(v["valid"] for v in view.values()),
            "replica": loop.replica,
            "incarnation": loop.incarnation,
            "share_calls": loop.calls,
            "share_failures": loop.failures,
            "granted": core.granted,
            "waited": core.waited,
            "shed": core.shed,
            "backends": view,
        }
        return JSONResponse(doc, status_code=200 if doc["ok"] else 503)

    app.add_api_route("/healthz", healthz, methods=["HEAD"], include_in_schema=False)  # (monitors, curl -I)

    from gpupool.adapters.http.proxy import add_proxy_routes
    from gpupool.adapters.http.surface import configure_backend, configure_model

    add_proxy_routes(app, host, timeout_s=proxy_timeout_s)

    def options(backends: dict[str, Any]) -> None:
        for bid, v in backends.items():
            configure_backend(app, bid, priority_scheduling=bool(v.get("priority_scheduling")))
            configure_model(app, v["model"], task=v.get("task"), max_model_len=v.get("max_model_len"))

    loop.on_backends = options
    app.add_middleware(
        BodyLimit, max_body_bytes=DEFAULT_MAX_BODY_BYTES, max_proxy_body_bytes=max_proxy_body_bytes
    )
    app.state.max_proxy_body_bytes = max_proxy_body_bytes
    return app
