"""`create_app`: the gateway's FastAPI application over one `LeaseController`. No module-level state:
everything lives on the app built here (``app.state.gateway``), so tests build as many as they like.

Routes (Bearer auth on all but ``/healthz`` and ``/metrics``; a tenant sees only its own leases,
tickets and events; ``/v1/admin/*`` and the agent route need role ``admin``):

- ``POST /v1/leases`` acquire; ``GET /v1/leases``; ``GET /v1/leases/{id}``; ``POST /v1/leases/{id}/renew``;
  ``DELETE /v1/leases/{id}`` (idempotent); ``GET|DELETE /v1/tickets/{ticket}`` (``?wait_s=`` long-polls;
  DELETE of a granted ticket is 409 naming its lease, which stays active);
- ``GET /v1/pool``; ``GET /v1/events`` (server-sent events: granted, renewed, released, expired,
  preempted, revoked, queued, shed, failed, pause, resume);
- ``POST /v1/nodes/{node}/readings`` (node agents): body ``{"gpus": [{"gpu_id", "vram_used_mib",
  "vram_total_mib", "temperature_c", "util_pct", "health": ok|degraded|failed, "xids": [..]}]}``. Each
  reading feeds the core `WatermarkBank`: at >= 88 % VRAM (or >= 80 degC) the GPU is PAUSED: P2
  acquisitions that could only land there get 429 + Retry-After and the holders of P2 leases on it get
  a ``pause`` event on ``/v1/events``; at <= 70 % (and <= 75 degC) a ``resume`` event follows.
  ``failed`` health revokes the GPU's leases, ``degraded`` stops new ones, ``ok`` restores;
- ``POST /v1/nodes/{node}/events`` (node agents): ``{"resync", "dropped_events", "workloads": [..],
  "events": [{"seq", "kind", "at_s", "gpu_id", "lease_id", "reason", "pauser", "frees", "latency_ms"}]}``;
  a ``revoke`` event for a lease on that node ends it as REVOKED (its holder gets a ``revoked`` event).
  Opt-in (``create_app(agent_events=True)``, on in ``gpupool serve``/``run``): without it agents fall back
  to ``DELETE /v1/leases/{id}`` for revocations;
- ``PUT /v1/nodes/{node}/slices`` (node agents): ``{"slices": [{"id", "gpu_id", "kind", "vram_mib",
  "compute_milli", "index", "model", "profile", "uuid", "healthy", "mps_pipe_dir"}]}``, the node's whole
  discovered slice list: new slices join the pool, vanished or reshaped ones are revoked (holders get
  ``revoked`` events) and removed, health follows (`LeaseController.sync_node`);
- ``POST /v1/admin/gpus/{gpu_id}/drain``, ``POST /v1/admin/slices/{slice_id}/health``,
  ``PUT /v1/admin/watermarks``; ``POST /v1/noop`` + ``DELETE /v1/noop/{id}`` (the framework's own
  ceiling, for the benchmark); the OpenAI-compatible proxy (`gpupool.adapters.http.proxy`).

Outcome codes map to HTTP statuses in `gpupool.adapters.http.views` only (`STATUS`); the JSON views
of leases, tickets and events live there too (re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from gpupool.adapters.http import context, errors, jsonbody, leasefast
from gpupool.adapters.http import schemas as s
from gpupool.adapters.http.auth import Principal, TokenTable
from gpupool.adapters.http.context import (
    CLOSED_META,
    DEVICE_STATES_META,
    DRAINED_META,
    Gateway,
    Metrics,
    Sizer,
    stored_drained,
)
from gpupool.adapters.http.docs import install_docs
from gpupool.adapters.http.errors import BadEncoding, BadJson, err, unsupported_encoding
from gpupool.adapters.http.errors import HttpError as _HttpError
from gpupool.adapters.http.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROXY_BODY_BYTES, BodyLimit
from gpupool.adapters.http.node_slices import remember, to_slices
from gpupool.adapters.http.runtime import EventHub, GroupCommitter, StoreUnavailable
from gpupool.adapters.http.views import (
    STATUS,
    FastJSONResponse,
    event_json,
    lease_json,
    outcome_response,
    sse_stream,
    ticket_json,
)
from gpupool.core.controller import LeaseController
from gpupool.core.errors import InvalidInput, StoreDamaged, StoreRefused, StoreUnreachable, UnknownId
from gpupool.core.model import Lease
from gpupool.core.outcome import OutcomeCode
from gpupool.core.poolview import pool_view
from gpupool.core.watermarks import Reading, WatermarkConfig


def create_app(
    controller: LeaseController,
    *,
    tokens: TokenTable,
    sizer: Sizer | None = None,
    metrics: Metrics | None = None,
    tick_s: float = 0.1,
    proxy: bool = True,
    proxy_timeout_s: float = 300.0,
    agent_events: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_proxy_body_bytes: int = DEFAULT_MAX_PROXY_BODY_BYTES,
    events_retain: int | None = None,
) -> FastAPI:
    """The gateway app. ``max_body_bytes`` caps lease/admin/agent request bodies and
    ``max_proxy_body_bytes`` the OpenAI routes' (413 above); ``events_retain``: how many events
    ``/v1/events`` can replay after ``Last-Event-ID`` (default `runtime.RETAIN_EVENTS`)."""
    hub = EventHub() if events_retain is None else EventHub(retain=events_retain)
    controller.sink = hub
    controller.autoflush = False
    gw = Gateway(controller, tokens, GroupCommitter(controller), hub, sizer, metrics, tick_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw.tasks.append(asyncio.create_task(_ticker(gw)))
        try:
            yield
        finally:
            for t in gw.tasks:
                t.cancel()
            for close in gw.closers:
                await close()
            hub.close()
            await gw.committer.close()

    app = FastAPI(
        title="gpupool gateway",
        version="1",
        lifespan=lifespan,
        description="GPU slice leases (VRAM MiB x compute), priority admission, OpenAI-compatible proxy. "
        "Authenticate with `Authorization: Bearer <token>` (the Authorize button).",
        docs_url=None,
        redoc_url=None,
    )
    app.router.route_class = _Route
    app.state.gateway = gw
    errors.install(app)

    @app.exception_handler(StoreDamaged)
    async def store_damaged(_: Request, exc: StoreDamaged) -> JSONResponse:
        return err(503, str(exc), "store_damaged")

    @app.exception_handler(StoreUnreachable)
    async def store_unreachable(_: Request, exc: StoreUnreachable) -> JSONResponse:
        return err(503, f"lease store unavailable: {exc}", "store_unavailable", retry=1.0)

    @app.exception_handler(StoreRefused)
    async def store_refused(_: Request, exc: StoreRefused) -> JSONResponse:
        return err(503, f"store unavailable: {exc}", "store_unavailable", retry=1.0)

    @app.exception_handler(StoreUnavailable)
    async def store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return err(503, f"lease store unavailable: {exc}", "store_unavailable", retry=1.0)

    install_docs(app)
    _routes(app, gw, agent_events=agent_events)
    if proxy:
        from gpupool.adapters.http.proxy import add_proxy_routes

        add_proxy_routes(app, gw, timeout_s=proxy_timeout_s)
        from gpupool.adapters.http.shares import add_share_routes

        add_share_routes(app, gw)  # proxy replicas' KV shares (`POST /v1/kv/shares`)
    from gpupool.adapters.http.console import add_console_routes

    add_console_routes(app)
    app.add_middleware(leasefast.LeaseFastPath, gateway=gw)
    # added last, so outermost: it also covers the fast paths (middlewares added above)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes, max_proxy_body_bytes=max_proxy_body_bytes)
    app.state.max_proxy_body_bytes = max_proxy_body_bytes  # the native proxy path's limit (`native`)
    return app


# ---------------------------------------------------------------------- auth
async def current_principal(request: Request) -> Principal:
    """The FastAPI dependency for Bearer auth (reads the app's own `Gateway`, no global state).

    ``async`` on purpose: FastAPI runs a sync dependency in a worker thread, one hop per request."""
    gw: Gateway = request.app.state.gateway
    h = request.headers.get("authorization", "")
    if not h.lower().startswith("bearer "):
        raise _HttpError(
            401, "missing bearer token", "unauthenticated", headers={"WWW-Authenticate": "Bearer"}
        )
    who = gw.tokens.lookup(h[7:].strip())
    if who is None:
        raise _HttpError(401, "invalid token", "unauthenticated", headers={"WWW-Authenticate": "Bearer"})
    return who


Who = Annotated[Principal, Depends(current_principal)]


async def admin_principal(who: Who) -> Principal:
    """Role ``admin`` or 403; a dependency, so a tenant gets 403 before its body is validated."""
    if not who.is_admin:
        raise _HttpError(403, "this route needs role admin", "forbidden")
    return who


AdminWho = Annotated[Principal, Depends(admin_principal)]


class _JsonRequest(Request):
    """A request whose JSON body is decoded by the bounded decoder (`jsonbody.loads`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            enc = unsupported_encoding(self.headers.get("content-encoding"))
            if enc is not None:
                raise BadEncoding(enc)
            try:
                self._json = jsonbody.loads(await self.body(), unique_keys=True)
            except jsonbody.JsonBodyError as exc:
                raise BadJson(exc) from None
        return self._json


class _Route(APIRoute):
    """FastAPI's route, with bodies parsed by `_JsonRequest` (depth-bounded, UTF-8-checked)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        inner = super().get_route_handler()
        if self.body_field is None:  # no JSON body to parse (e.g. the proxy routes): as it was
            return inner

        async def handler(request: Request) -> Response:
            return await inner(_JsonRequest(request.scope, request.receive))

        return handler


# ---------------------------------------------------------------------- routes
def _resp(*codes: int, **models: Any) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses``: each code in ``codes`` with the lease API's error shape (422 with the
    validation detail); ``models``: ``_201=LeaseOut`` style overrides."""
    out: dict[int | str, dict[str, Any]] = {}
    for c in codes:
        out[c] = {"model": s.ValidationErrorOut if c == 422 else s.ErrorOut}
    for k, m in models.items():
        out[int(k.lstrip("_"))] = {"model": m}
    return out


AUTH = (401,)
BODY = (400, 401, 413, 422)
ADMIN = (401, 403)
ADMIN_BODY = (400, 401, 403, 413, 422)
HEAD_OK = ["GET", "HEAD"]
"""Methods of a probe route outside the OpenAPI schema (``/metrics``): monitors and ``curl -I`` send
HEAD. (``/healthz`` is in the schema, so its HEAD is a separate route: one id per operation.)"""


def _routes(app: FastAPI, gw: Gateway, *, agent_events: bool) -> None:
    c = gw.controller

    def scope(who: Principal) -> str | None:
        return None if who.is_admin else who.tenant

    def store_first(key: str, value: str) -> None:
        """A pool setting is stored before it takes effect: a store that refuses is 503 and
        leaves the pool as it was (watermarks, drains, slice marks)."""
        try:
            c.store.set_meta(key, value)
        except Exception as exc:
            raise StoreUnavailable(str(exc)) from exc

    @app.get("/healthz", response_model=s.HealthOut, response_model_exclude_none=True)
    async def healthz() -> dict[str, Any]:
        why = await gw.committer.probe()  # (its probe write runs off the event loop)
        return {"ok": True} if why is None else {"ok": False, "store_error": why}

    # HEAD as its own route, out of the schema: one route for both methods gives the OpenAPI
    # document two operations with one operation id
    app.add_api_route(
        "/healthz",
        healthz,
        methods=["HEAD"],
        response_model=s.HealthOut,
        response_model_exclude_none=True,
        include_in_schema=False,
    )

    @app.api_route("/metrics", methods=HEAD_OK, include_in_schema=False)
    async def metrics() -> Response:
        if gw.metrics is None:
            return Response("metrics disabled\n", status_code=404, media_type="text/plain")
        data, ctype = gw.metrics.render()
        return Response(data, media_type=ctype)

    # the four routes `leasefast.LeaseFastPath` also answers: one handler each, in `leasefast`
    @app.post("/v1/noop", status_code=201, responses=_resp(*BODY, _201=s.NoopOut))
    async def noop_acquire(who: Who, body: s.LeaseIn) -> Response:
        return leasefast.noop_acquire(who)

    @app.delete("/v1/noop/{noop_id}", responses=_resp(*AUTH, _200=s.NoopOut))
    async def noop_release(noop_id: str, who: Who) -> Response:
        return leasefast.noop_release(noop_id)

    @app.post(
        "/v1/leases",
        status_code=201,
        responses=_resp(*BODY, 409, 429, 503, _201=s.LeaseOut, _202=s.TicketOut),
        description="Acquire a lease. 201 granted (``victims``: the caller's own preempted leases, "
        "``victims_other_tenants``: how many of other tenants'), 202 queued (poll the ticket), "
        "409 its ticket was cancelled during ``wait_s``, "
        "429 backpressure / shed / no capacity now (Retry-After), 503 no healthy slice could ever "
        "hold it. " + s.PRIORITY_DOC,
    )
    async def acquire(body: s.LeaseIn, who: Who, request: Request) -> Response:
        return await leasefast.acquire(gw, body, who, request.receive)

    @app.get("/v1/leases", responses=_resp(*AUTH, _200=s.LeasesOut))
    async def list_leases(who: Who) -> JSONResponse:
        return FastJSONResponse({"leases": [lease_json(gw, x) for x in c.leases(tenant=scope(who))]})

    @app.get("/v1/leases/{lease_id}", responses=_resp(*AUTH, 404, _200=s.LeaseOut))
    async def get_lease(lease_id: str, who: Who) -> JSONResponse:
        return FastJSONResponse(lease_json(gw, c.get(lease_id, tenant=scope(who))))

    @app.post(
        "/v1/leases/{lease_id}/renew",
        responses=_resp(*BODY, 404, _200=s.LeaseOut, _409=s.RenewConflictOut),
    )
    async def renew(lease_id: str, who: Who, body: s.RenewIn | None = None) -> JSONResponse:
        out = c.renew(lease_id, ttl_s=body.ttl_s if body else None, tenant=scope(who))
        await gw.committer.durable()
        assert out.lease is not None
        status = 200 if out.code is OutcomeCode.RENEWED else 409
        body_out = lease_json(gw, out.lease)
        if status == 409:
            body_out = {
                "error": f"lease already {out.lease.state}",
                "code": "already_ended",
                "lease": body_out,
            }
        return FastJSONResponse(body_out, status_code=status)

    @app.delete("/v1/leases/{lease_id}", responses=_resp(*AUTH, 404, _200=s.LeaseOut))
    async def release(lease_id: str, who: Who) -> Response:
        return await leasefast.release(gw, lease_id, who)

    @app.get("/v1/tickets/{ticket}", responses=_resp(*AUTH, 404, 422, _200=s.TicketOut))
    async def get_ticket(
        ticket: str, who: Who, wait_s: Annotated[float, Query(ge=0, le=60, allow_inf_nan=False)] = 0.0
    ) -> JSONResponse:
        st = c.ticket(ticket, tenant=scope(who))
        if st.state == "queued" and wait_s > 0:
            await gw.hub.wait_ticket(ticket, wait_s)
            st = c.ticket(ticket, tenant=scope(who))
        return FastJSONResponse(ticket_json(gw, st))

    @app.delete("/v1/tickets/{ticket}", responses=_resp(*AUTH, 404, 409, _200=s.TicketOut))
    async def cancel_ticket(ticket: str, who: Who) -> JSONResponse:
        st = c.cancel(ticket, tenant=scope(who))
        await gw.committer.durable()
        if st.state == "granted" and st.lease is not None:  # NOTE: cancelling never ends a lease
            lid = st.lease.id
            msg = f"ticket {ticket} was already granted lease {lid}; release it with DELETE /v1/leases/{lid}"
            return err(409, msg, "already_granted")
        return FastJSONResponse(ticket_json(gw, st))

    @app.get("/v1/pool", responses=_resp(*AUTH, _200=dict[str, Any]))
    async def pool(who: Who) -> JSONResponse:
        return FastJSONResponse(pool_view(c))

    @app.get(
        "/v1/events",
        response_class=StreamingResponse,
        responses={
            **_resp(*AUTH),
            200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
        },
        description="Server-sent events, each with an ``id:``. Reconnect with ``Last-Event-ID`` "
        f"to get every event after it without loss while it is among the last {gw.hub.retain} "
        "events; older (or another process's) ids get a ``gap`` event first. A subscriber that "
        "falls behind by more than its queue gets a ``lagged`` event and the stream ends (resume "
        "with Last-Event-ID).",
    )
    async def events(
        request: Request,
        who: Who,
        last_event_id: Annotated[str | None, Header(max_length=64)] = None,
    ) -> StreamingResponse:
        sub_id, q = gw.hub.subscribe(who, last_event_id)
        return StreamingResponse(
            sse_stream(gw, who, sub_id, q),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/nodes/{node}/readings", responses=_resp(*ADMIN_BODY, _200=s.ReadingsOut))
    async def readings(node: str, body: s.ReadingsIn, who: AdminWho) -> JSONResponse:
        gpus = {st.slice.gpu_id: st.slice.node for st in c.allocator.states()}
        for i, g in enumerate(body.gpus):
            if gpus.get(g.gpu_id) != node:
                raise InvalidInput(f"gpus[{i}].gpu_id", g.gpu_id, f"no such GPU on node {node}")
        now = c.clock.now()
        signals = []
        for g in body.gpus:
            r = Reading(
                g.gpu_id,
                g.vram_used_mib,
                g.vram_total_mib,
                at_s=now,
                temperature_c=g.temperature_c,
                util_pct=g.util_pct,
            )
            ev = c.feed_reading(r, health=g.health, xids=tuple(g.xids))
            if ev is not None:
                signals.append({"gpu_id": ev.gpu_id, "signal": ev.kind, "lease_ids": list(ev.lease_ids)})
        gw.committer.kick()
        await gw.committer.durable()
        return FastJSONResponse(
            {"accepted": len(body.gpus), "signals": signals, "paused_gpus": sorted(c.paused_gpus())}
        )

    if agent_events:

        @app.post("/v1/nodes/{node}/events", responses=_resp(*ADMIN_BODY, _200=s.NodeEventsOut))
        async def node_events(node: str, body: s.NodeEventsIn, who: AdminWho) -> JSONResponse:
            """Agent decisions; ``revoke`` of a lease on this node ends it (REVOKED), the rest is counted."""
            revoked = []
            for e in body.events:
                if e.kind != "revoke" or not e.lease_id:
                    continue
                try:
                    lease = c.get(e.lease_id)
                except UnknownId:
                    continue
                if lease.node == node and not lease.state.ended:
                    c.revoke(
                        e.lease_id, reason=f"node agent on {node}: {e.reason or 'could not free the GPU'}"
                    )
                    revoked.append(e.lease_id)
            gw.agent_events += len(body.events)
            for listen in gw.agent_listeners:
                listen(node, list(body.events))
            states = {
                w.lease_id: w.state
                for w in body.workloads
                if w.state in ("granted-pending-free", "free-failed")
            }
            if states != gw.device_states.get(node, {}) or not gw.device_states_saved:
                # kept in the store too (only when it changes: rarely, around a preemption), so
                # standby replicas answer it from their view and a new leader starts from it
                if states:
                    gw.device_states[node] = states
                else:
                    gw.device_states.pop(node, None)
                try:
                    c.store.set_meta(DEVICE_STATES_META, json.dumps(gw.device_states, sort_keys=True))
                    gw.device_states_saved = True
                except Exception:  # (in memory it is current; the next report writes it again)
                    gw.device_states_saved = False
            await gw.committer.durable()
            return FastJSONResponse({"accepted": len(body.events), "revoked": revoked})

    @app.put("/v1/nodes/{node}/slices", responses=_resp(*ADMIN_BODY, _200=s.NodeSlicesOut))
    async def node_slices(node: str, body: s.NodeSlicesIn, who: AdminWho) -> JSONResponse:
        report = c.sync_node(node, to_slices(node, body.slices))
        remember(gw, node, body.slices)  # kept in the store: a restart recovers leases on them
        gw.committer.kick()
        await gw.committer.durable()
        return FastJSONResponse({"node": node, "slices": len(body.slices), **report})

    @app.post("/v1/admin/gpus/{gpu_id:path}/drain", responses=_resp(*ADMIN_BODY, 404, _200=s.DrainOut))
    async def drain(gpu_id: str, body: s.DrainIn, who: AdminWho) -> JSONResponse:
        if not c.allocator.ledger.on_gpu(gpu_id):
            raise UnknownId("gpu", gpu_id)
        old, was = stored_drained(c), gpu_id in c.drained
        drained = old - {gpu_id} if body.undo else old | {gpu_id}
        store_first(DRAINED_META, json.dumps(sorted(drained)))
        if body.undo:
            c.undrain_gpu(gpu_id)
            ended: tuple[Lease, ...] = ()
        else:
            ended = c.drain_gpu(gpu_id, revoke=body.revoke, reason=body.reason)
        try:
            await gw.committer.durable()
        except StoreUnavailable:  # the revocations were undone: the drain (and its record) is too
            with contextlib.suppress(Exception):
                c.store.set_meta(DRAINED_META, json.dumps(sorted(old)))
            if was:
                c.drain_gpu(gpu_id)
            else:
                c.undrain_gpu(gpu_id)
            raise
        return FastJSONResponse({"gpu_id": gpu_id, "drained": not body.undo, "leases": [x.id for x in ended]})

    @app.post(
        "/v1/admin/slices/{slice_id:path}/health",
        responses=_resp(*ADMIN_BODY, 404, 409, _200=s.SliceHealthOut),
    )
    async def slice_health(slice_id: str, body: s.SliceHealthIn, who: AdminWho) -> JSONResponse:
        was = c.allocator.slice_state(slice_id).healthy  # (UnknownId: 404)
        if body.healthy and (why := context.reopen_refused(c, slice_id)):
            return err(409, why, "gpu_drained")
        old, closed = stored_drained(c, CLOSED_META), slice_id in c.closed
        marks = old - {slice_id} if body.healthy else old | {slice_id}
        store_first(CLOSED_META, json.dumps(sorted(marks)))
        ended = c.mark_slice(slice_id, healthy=body.healthy, revoke=body.revoke, reason=body.reason)
        try:
            await gw.committer.durable()
        except StoreUnavailable:  # the revocations were undone: the mark is too (nothing changed)
            with contextlib.suppress(Exception):
                c.store.set_meta(CLOSED_META, json.dumps(sorted(old)))
            c.mark_slice(slice_id, healthy=was)
            if closed:
                c.closed.add(slice_id)
            else:
                c.closed.discard(slice_id)
            raise
        return FastJSONResponse(
            {"slice_id": slice_id, "healthy": body.healthy, "leases": [x.id for x in ended]}
        )

    def set_watermarks(values: dict[str, Any]) -> JSONResponse:
        cfg = WatermarkConfig(**values)  # InvalidInput (422) on an inconsistent set, nothing changed
        store_first("watermarks", json.dumps(values))
        c.set_watermarks(cfg)
        return FastJSONResponse(values)

    @app.get("/v1/admin/watermarks", responses=_resp(*ADMIN, _200=s.WatermarksOut))
    async def get_watermarks(who: AdminWho) -> JSONResponse:
        return FastJSONResponse(_watermarks(c))

    @app.put(
        "/v1/admin/watermarks",
        responses=_resp(*ADMIN_BODY, _200=s.WatermarksOut),
        description="Replace the whole configuration: every field is required (422 naming a missing "
        "one). To change some fields only, use PATCH.",
    )
    async def put_watermarks(body: s.WatermarksIn, who: AdminWho) -> JSONResponse:
        return set_watermarks(body.model_dump())

    @app.patch(
        "/v1/admin/watermarks",
        responses=_resp(*ADMIN_BODY, _200=s.WatermarksOut),
        description="Change the fields given; the others keep their current values.",
    )
    async def patch_watermarks(body: s.WatermarksPatch, who: AdminWho) -> JSONResponse:
        given = {k: v for k, v in body.model_dump().items() if v is not None}
        return set_watermarks({**_watermarks(c), **given})


def _watermarks(c: LeaseController) -> dict[str, Any]:
    cfg = c.bank.config
    return {k: getattr(cfg, k) for k in s.WatermarksOut.model_fields}


async def _ticker(gw: Gateway) -> None:
    while True:
        await asyncio.sleep(gw.tick_s)
        try:
            gw.controller.tick()
            gw.committer.kick()
        except Exception:  # noqa: S112 (the ticker must survive one bad tick)
            continue


__all__ = [
    "STATUS",
    "Gateway",
    "create_app",
    "current_principal",
    "event_json",
    "lease_json",
    "outcome_response",
    "ticket_json",
]
