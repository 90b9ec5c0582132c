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
- ``POST /v1/admin/gpus/{gpu_id}/drain``, ``POST /v1/admin/slices/{slice_id}/health``,
  ``PUT /v1/admin/watermarks``; ``POST /v1/noop`` + ``DELETE /v1/noop/{id}`` (the framework's own
  ceiling, for the benchmark); the OpenAI-compatible proxy (`gpupool.adapters.http.proxy`).

Outcome codes map to HTTP statuses here and only here (`STATUS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gpupool.adapters.http import schemas as s
from gpupool.adapters.http.auth import Principal, TokenTable
from gpupool.adapters.http.runtime import EventHub, GroupCommitter, StoreUnavailable
from gpupool.core.controller import LeaseController, TicketStatus
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.model import Lease
from gpupool.core.model import Request as CoreRequest
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.poolview import pool_view
from gpupool.core.ports import GatewayEvent
from gpupool.core.priority import parse_priority
from gpupool.core.watermarks import Reading, WatermarkConfig
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import Resources

STATUS: dict[OutcomeCode, int] = {
    OutcomeCode.GRANTED: 201,
    OutcomeCode.PREEMPTED_VICTIMS: 201,
    OutcomeCode.QUEUED: 202,
    OutcomeCode.BACKPRESSURE: 429,
    OutcomeCode.SHED: 429,
    OutcomeCode.NO_CAPACITY: 429,
    OutcomeCode.UNRESOLVABLE: 503,
    OutcomeCode.RELEASED: 200,
    OutcomeCode.ALREADY_ENDED: 200,
    OutcomeCode.RENEWED: 200,
}


class Sizer(Protocol):
    """Token counts -> MiB for a model (the KV-cache estimator). Raises ValueError for unknown models."""

    def request_mib(self, model: str, tokens: int) -> int: ...

    def instance_mib(self, model: str, tokens: int) -> int: ...


class Metrics(Protocol):
    def render(self) -> tuple[bytes, str]: ...

    def observe_proxy(self, model: str, status: int, ttft_s: float | None, latency_s: float) -> None: ...


@dataclass
class Gateway:
    controller: LeaseController
    tokens: TokenTable
    committer: GroupCommitter
    hub: EventHub
    sizer: Sizer | None = None
    metrics: Metrics | None = None
    tick_s: float = 0.1
    default_max_tokens: int = 256
    agent_events: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


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
) -> FastAPI:
    hub = EventHub()
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
        description="GPU slice leases (VRAM MiB x compute), priority admission, OpenAI-compatible proxy.",
    )
    app.state.gateway = gw
    _errors(app)
    _routes(app, gw, agent_events=agent_events)
    if proxy:
        from gpupool.adapters.http.proxy import add_proxy_routes

        add_proxy_routes(app, gw, timeout_s=proxy_timeout_s)
    from gpupool.adapters.http.console import add_console_routes

    add_console_routes(app)
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


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        msg: str,
        code: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(msg)
        self.status, self.msg, self.code, self.field, self.headers = status, msg, code, field, headers


def _err(
    status: int, msg: str, code: str, *, field: str | None = None, retry: float | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"error": msg, "code": code}
    if field is not None:
        body["field"] = field
    headers = {}
    if retry is not None:
        body["retry_after_s"] = retry
        headers["Retry-After"] = str(max(1, round(retry)))
        headers["x-gpupool-dropped-reason"] = code
    return JSONResponse(body, status_code=status, headers=headers)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(_HttpError)
    async def http_error(_: Request, exc: _HttpError) -> JSONResponse:
        r = _err(exc.status, exc.msg, exc.code, field=exc.field)
        for k, v in (exc.headers or {}).items():
            r.headers[k] = v
        return r

    @app.exception_handler(InvalidInput)
    async def invalid(_: Request, exc: InvalidInput) -> JSONResponse:
        return _err(422, str(exc), "invalid_input", field=exc.field)

    @app.exception_handler(UnknownId)
    async def unknown(_: Request, exc: UnknownId) -> JSONResponse:
        return _err(404, str(exc), "not_found")

    @app.exception_handler(StoreUnavailable)
    async def store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return _err(503, f"lease store unavailable: {exc}", "store_unavailable", retry=1.0)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"invalid {loc or 'request'}: {first.get('msg', 'bad input')}"
        return JSONResponse(
            {"error": msg, "code": "invalid_input", "field": loc or None, "detail": _jsonable(errs)},
            status_code=422,
        )


def _jsonable(errs: Any) -> Any:
    """Validation errors without the offending input (it may be NaN, huge or binary): loc, msg, type."""
    return [
        {
            "loc": [str(x) for x in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errs
    ]


# ---------------------------------------------------------------------- views
def lease_json(gw: Gateway, lease: Lease, out: Outcome | None = None) -> dict[str, Any]:
    g0 = lease.grants[0] if lease.grants else None
    b = gw.controller.backend_of(lease)
    return {
        "id": lease.id,
        "state": lease.state.value,
        "tenant": lease.request.tenant,
        "priority": lease.priority,
        "node": lease.node,
        "slice_id": g0.slice_id if g0 else "",
        "gpu_id": g0.gpu_id if g0 else "",
        "vram_mib": lease.total.vram_mib,
        "compute_milli": lease.total.compute_milli,
        "grants": [
            {
                "slice_id": g.slice_id,
                "gpu_id": g.gpu_id,
                "vram_mib": g.resources.vram_mib,
                "compute_milli": g.resources.compute_milli,
            }
            for g in lease.grants
        ],
        "granted_at": lease.granted_at,
        "expires_at": lease.expires_at,
        "revision": lease.revision,
        "model": lease.request.model,
        "backend": b.id if b else "",
        "reason": lease.reason,
        "labels": dict(lease.request.labels),
        "early_warning": bool(out and out.early_warning),
        "victims": [v.id for v in out.victims] if out else [],
    }


def ticket_json(gw: Gateway, st: TicketStatus) -> dict[str, Any]:
    return {
        "ticket": st.ticket,
        "state": st.state,
        "enqueued_at": st.enqueued_at,
        "deadline_at": st.deadline_at,
        "lease": lease_json(gw, st.lease) if st.lease else None,
        "reason": st.reason,
    }


def outcome_response(gw: Gateway, out: Outcome) -> JSONResponse:
    status = STATUS[out.code]
    if out.granted and out.lease is not None:
        return JSONResponse(lease_json(gw, out.lease, out), status_code=201)
    if out.code is OutcomeCode.QUEUED and out.ticket:
        st = gw.controller.ticket(out.ticket)
        if st.state == "granted" and st.lease is not None:
            return JSONResponse(lease_json(gw, st.lease), status_code=201)
        body = ticket_json(gw, st)
        body["poll"] = f"/v1/tickets/{out.ticket}"
        if st.state == "shed":
            return _err(429, st.reason or "shed", "shed", retry=gw.controller.config.retry_after_s)
        if st.state == "failed":
            return _err(503, st.reason or "failed", "failed")
        return JSONResponse(body, status_code=202, headers={"Location": body["poll"]})
    code = out.code.value
    return _err(status, out.reason or code, code, retry=out.retry_after_s if status == 429 else None)


def event_json(gw: Gateway, e: GatewayEvent, who: Principal) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": e.kind, "at": e.at}
    if e.lease is not None:
        d["lease"] = lease_json(gw, e.lease)
    if e.ticket:
        d["ticket"] = e.ticket
    if e.gpu_id:
        d["gpu_id"] = e.gpu_id
        ids = list(e.lease_ids)
        if not who.is_admin:
            ids = [i for i in ids if _tenant_of(gw, i) == who.tenant]
        d["lease_ids"] = ids
    if e.reason:
        d["reason"] = e.reason
    if e.wait_s:
        d["wait_s"] = e.wait_s
    return d


def _tenant_of(gw: Gateway, lease_id: str) -> str:
    try:
        return gw.controller.get(lease_id).request.tenant
    except UnknownId:
        return ""


# ---------------------------------------------------------------------- building a core request
def build_request(gw: Gateway, body: s.LeaseIn, who: Principal) -> CoreRequest:
    prio = parse_priority(body.priority)
    vram = body.vram_mib
    model = body.model or ""
    if vram is None:
        if not model:
            raise InvalidInput("vram_mib", None, "give vram_mib, or model with prompt_tokens/max_tokens")
        if gw.sizer is None:
            raise InvalidInput("model", model, "this gateway has no KV-cache estimator")
        tokens = (body.prompt_tokens or 0) + (body.max_tokens or gw.default_max_tokens)
        try:
            if model in gw.controller.models():
                vram = gw.sizer.request_mib(model, tokens)
            else:
                vram = gw.sizer.instance_mib(model, tokens)
        except ValueError as exc:
            raise InvalidInput("model", model, str(exc)) from None
    if body.compute_milli is not None and body.compute_pct is not None:
        raise InvalidInput("compute_pct", body.compute_pct, "give compute_pct or compute_milli, not both")
    compute = body.compute_milli if body.compute_milli is not None else (body.compute_pct or 0) * 10
    return CoreRequest(
        id=str(uuid.uuid4()),
        tenant=who.tenant,
        priority=prio,
        demand=Resources(vram, compute),
        ttl_s=float(body.ttl_s),
        kinds=frozenset(SliceKind(k) for k in body.kinds),
        preemptible=body.preemptible,
        gpu_count=body.gpu_count,
        nodes=frozenset(body.nodes),
        model=model,
        labels=tuple(sorted(body.labels.items())),
    )


# ---------------------------------------------------------------------- routes
def _routes(app: FastAPI, gw: Gateway, *, agent_events: bool) -> None:
    c = gw.controller

    def admin(who: Principal) -> None:
        if not who.is_admin:
            raise _HttpError(403, "this route needs role admin", "forbidden")

    def scope(who: Principal) -> str | None:
        return None if who.is_admin else who.tenant

    @app.get("/healthz", include_in_schema=True)
    async def healthz() -> dict[str, Any]:
        if gw.committer.healthy():
            return {"ok": True}
        return {"ok": False, "store_error": str(gw.committer.failed)}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        if gw.metrics is None:
            return Response("metrics disabled\n", status_code=404, media_type="text/plain")
        data, ctype = gw.metrics.render()
        return Response(data, media_type=ctype)

    @app.post("/v1/noop", status_code=201)
    async def noop_acquire(who: Who, body: s.LeaseIn) -> JSONResponse:
        return JSONResponse({"id": "noop", "tenant": who.tenant}, status_code=201)

    @app.delete("/v1/noop/{noop_id}")
    async def noop_release(noop_id: str, who: Who) -> JSONResponse:
        return JSONResponse({"id": noop_id, "state": "released"})

    @app.post(
        "/v1/leases",
        status_code=201,
        responses={
            201: {"model": s.LeaseOut},
            202: {"model": s.TicketOut},
            429: {"model": s.ErrorOut},
            503: {"model": s.ErrorOut},
        },
    )
    async def acquire(body: s.LeaseIn, who: Who) -> JSONResponse:
        req = build_request(gw, body, who)
        out = c.acquire(req, wait_s=body.queue_timeout_s, gpu_id=body.gpu_id or "")
        await gw.committer.durable()
        queued = out.code is OutcomeCode.QUEUED and out.ticket
        if queued and body.wait_s > 0 and c.ticket(str(out.ticket)).state == "queued":
            await gw.hub.wait_ticket(str(out.ticket), body.wait_s)
        return outcome_response(gw, out)

    @app.get("/v1/leases", responses={200: {"model": list[s.LeaseOut]}})
    async def list_leases(who: Who) -> JSONResponse:
        return JSONResponse({"leases": [lease_json(gw, x) for x in c.leases(tenant=scope(who))]})

    @app.get("/v1/leases/{lease_id}", responses={200: {"model": s.LeaseOut}, 404: {"model": s.ErrorOut}})
    async def get_lease(lease_id: str, who: Who) -> JSONResponse:
        return JSONResponse(lease_json(gw, c.get(lease_id, tenant=scope(who))))

    @app.post(
        "/v1/leases/{lease_id}/renew", responses={200: {"model": s.LeaseOut}, 404: {"model": s.ErrorOut}}
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
        return JSONResponse(body_out, status_code=status)

    @app.delete("/v1/leases/{lease_id}", responses={200: {"model": s.LeaseOut}, 404: {"model": s.ErrorOut}})
    async def release(lease_id: str, who: Who) -> JSONResponse:
        out = c.release(lease_id, tenant=scope(who))
        await gw.committer.durable()
        assert out.lease is not None
        return JSONResponse(lease_json(gw, out.lease))

    @app.get("/v1/tickets/{ticket}", responses={200: {"model": s.TicketOut}, 404: {"model": s.ErrorOut}})
    async def get_ticket(
        ticket: str, who: Who, wait_s: Annotated[float, Query(ge=0, le=60, allow_inf_nan=False)] = 0.0
    ) -> JSONResponse:
        st = c.ticket(ticket, tenant=scope(who))
        if st.state == "queued" and wait_s > 0:
            await gw.hub.wait_ticket(ticket, wait_s)
            st = c.ticket(ticket, tenant=scope(who))
        return JSONResponse(ticket_json(gw, st))

    @app.delete(
        "/v1/tickets/{ticket}",
        responses={200: {"model": s.TicketOut}, 404: {"model": s.ErrorOut}, 409: {"model": s.ErrorOut}},
    )
    async def cancel_ticket(ticket: str, who: Who) -> JSONResponse:
        st = c.cancel(ticket, tenant=scope(who))
        await gw.committer.durable()
        if st.state == "granted" and st.lease is not None:  # NOTE: cancelling never ends a lease
            lid = st.lease.id
            msg = f"ticket {ticket} was already granted lease {lid}; release it with DELETE /v1/leases/{lid}"
            return _err(409, msg, "already_granted")
        return JSONResponse(ticket_json(gw, st))

    @app.get("/v1/pool")
    async def pool(who: Who) -> JSONResponse:
        return JSONResponse(pool_view(c))

    @app.get("/v1/events", response_class=StreamingResponse)
    async def events(request: Request, who: Who) -> StreamingResponse:
        sub_id, q = gw.hub.subscribe(who)

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b": gpupool events\n\n"
                while True:
                    try:
                        e = await asyncio.wait_for(q.get(), 15.0)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if e is None:
                        return
                    data = json.dumps(event_json(gw, e, who), separators=(",", ":"))
                    yield f"event: {e.kind}\ndata: {data}\n\n".encode()
            finally:
                gw.hub.unsubscribe(sub_id)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/nodes/{node}/readings")
    async def readings(node: str, body: s.ReadingsIn, who: Who) -> JSONResponse:
        admin(who)
        gpus = {st.slice.gpu_id: st.slice.node for st in c.allocator.states()}
        for i, g in enumerate(body.gpus):
            if gpus.get(g.gpu_id) != node:
                raise InvalidInput(f"gpus[{i}].gpu_id", g.gpu_id, f"no such GPU on node {node!r}")
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
        return JSONResponse(
            {"accepted": len(body.gpus), "signals": signals, "paused_gpus": sorted(c.paused_gpus())}
        )

    if agent_events:

        @app.post("/v1/nodes/{node}/events")
        async def node_events(node: str, body: s.NodeEventsIn, who: Who) -> JSONResponse:
            """Agent decisions; ``revoke`` of a lease on this node ends it (REVOKED), the rest is counted."""
            admin(who)
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
            await gw.committer.durable()
            return JSONResponse({"accepted": len(body.events), "revoked": revoked})

    @app.post("/v1/admin/gpus/{gpu_id:path}/drain")
    async def drain(gpu_id: str, body: s.DrainIn, who: Who) -> JSONResponse:
        admin(who)
        if body.undo:
            c.undrain_gpu(gpu_id)
            ended: tuple[Lease, ...] = ()
        else:
            ended = c.drain_gpu(gpu_id, revoke=body.revoke, reason=body.reason)
        await gw.committer.durable()
        return JSONResponse({"gpu_id": gpu_id, "drained": not body.undo, "leases": [x.id for x in ended]})

    @app.post("/v1/admin/slices/{slice_id:path}/health")
    async def slice_health(slice_id: str, body: s.SliceHealthIn, who: Who) -> JSONResponse:
        admin(who)
        ended = c.mark_slice(slice_id, healthy=body.healthy, revoke=body.revoke, reason=body.reason)
        await gw.committer.durable()
        return JSONResponse({"slice_id": slice_id, "healthy": body.healthy, "leases": [x.id for x in ended]})

    @app.put("/v1/admin/watermarks")
    async def watermarks(body: s.WatermarksIn, who: Who) -> JSONResponse:
        admin(who)
        cfg = WatermarkConfig(**body.model_dump())
        try:  # stored first: a store that refuses leaves the old thresholds in force
            c.store.set_meta("watermarks", json.dumps(body.model_dump()))
        except Exception as exc:
            raise StoreUnavailable(str(exc)) from exc
        c.set_watermarks(cfg)
        return JSONResponse(body.model_dump())


async def _ticker(gw: Gateway) -> None:
    while True:
        await asyncio.sleep(gw.tick_s)
        try:
            gw.controller.tick()
            gw.committer.kick()
        except Exception:  # noqa: S112 (the ticker must survive one bad tick)
            continue
