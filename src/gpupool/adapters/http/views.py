"""JSON views of leases, tickets, outcomes and events, and the SSE byte stream of `/v1/events`.

Outcome codes map to HTTP statuses here and only here (`STATUS`). Tenancy: ``victims`` of a grant
list only the caller's own preempted leases (all for an admin), the others are only counted;
a tenant's events name only its own lease ids.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from gpupool.adapters.fastjson import dumps
from gpupool.adapters.http import errors
from gpupool.adapters.http.auth import Principal
from gpupool.adapters.http.errors import err
from gpupool.adapters.http.runtime import Gap
from gpupool.core.controller import TicketStatus
from gpupool.core.errors import UnknownId
from gpupool.core.model import Lease
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.ports import GatewayEvent
from gpupool.core.priority import band

if TYPE_CHECKING:
    from gpupool.adapters.http.context import Gateway


class FastJSONResponse(JSONResponse):
    """Starlette's `JSONResponse` with the body encoded by `gpupool.adapters.fastjson` (orjson where
    installed): the same JSON. Every answer of the gateway app (`app.py`: the lease API, the no-op
    endpoints that measure it, pool, tickets, admin) goes through it."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


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


# ---------------------------------------------------------------------- views
def lease_json(
    gw: Gateway, lease: Lease, out: Outcome | None = None, who: Principal | None = None
) -> dict[str, Any]:
    """The API view of a lease. ``victims`` (from ``out``): the ids of the preempted leases that
    ``who`` may see (its own; all for an admin or ``who=None``), the rest only counted."""
    g0 = lease.grants[0] if lease.grants else None
    b = gw.controller.backend_of(lease)
    victims = list(out.victims) if out else []
    mine = [v.id for v in victims if who is None or who.is_admin or v.request.tenant == who.tenant]
    total = lease.total
    return {
        "id": lease.id,
        "state": lease.state.value,
        "tenant": lease.request.tenant,
        "priority": lease.priority,
        "band": band(lease.priority),
        "node": lease.node,
        "slice_id": g0.slice_id if g0 else "",
        "gpu_id": g0.gpu_id if g0 else "",
        "vram_mib": total.vram_mib,
        "compute_milli": total.compute_milli,
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
        "victims": mine,
        "victims_other_tenants": len(victims) - len(mine),
        "device_state": gw.device_states.get(lease.node, {}).get(lease.id, "usable"),
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


def outcome_response(gw: Gateway, out: Outcome, who: Principal | None = None) -> JSONResponse:
    status = STATUS[out.code]
    if out.granted and out.lease is not None:
        return FastJSONResponse(lease_json(gw, out.lease, out, who), status_code=201)
    if out.code is OutcomeCode.QUEUED and out.ticket:
        st = gw.controller.ticket(out.ticket)
        if st.state == "granted" and st.lease is not None:
            return FastJSONResponse(lease_json(gw, st.lease), status_code=201)
        body = ticket_json(gw, st)
        body["poll"] = f"/v1/tickets/{out.ticket}"
        if st.state == "shed":
            return err(429, st.reason or "shed", "shed", retry=gw.controller.config.retry_after_s)
        if st.state == "failed":
            return err(503, st.reason or "failed", "failed")
        if st.state == "cancelled":  # (by its holder, with DELETE /v1/tickets/{ticket}, during wait_s)
            return err(409, f"ticket {out.ticket} was cancelled: no lease was granted", "cancelled")
        return FastJSONResponse(body, status_code=202, headers={"Location": body["poll"]})
    code = out.code.value
    return err(status, out.reason or code, code, retry=out.retry_after_s if status == 429 else None)


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


async def sse_stream(
    gw: Gateway, who: Principal, sub_id: int, q: asyncio.Queue[tuple[int, GatewayEvent] | Gap | None]
) -> AsyncIterator[bytes]:
    """The SSE byte stream of one subscriber: ``id:``/``event:``/``data:`` frames, keep-alives."""
    try:
        yield b": gpupool events\n\n"
        while True:
            if q.empty() and gw.hub.overflowed(sub_id):
                data = json.dumps({"kind": "lagged", "reason": "fell behind; resume with Last-Event-ID"})
                yield f"event: lagged\ndata: {data}\n\n".encode()
                return
            try:
                item = await asyncio.wait_for(q.get(), 15.0)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if item is None:
                return
            if isinstance(item, Gap):
                gap = {
                    "kind": "gap",
                    "reason": item.reason,
                    "last_event_id": errors.safe(item.last_event_id),
                    "oldest_event_id": item.oldest_event_id,
                }
                yield f"event: gap\ndata: {json.dumps(gap)}\n\n".encode()
                continue
            seq, e = item
            data = json.dumps(event_json(gw, e, who), separators=(",", ":"))
            yield f"id: {gw.hub.event_id(seq)}\nevent: {e.kind}\ndata: {data}\n\n".encode()
    finally:
        gw.hub.unsubscribe(sub_id)
