"""KV-share routes of the leader's gateway: proxy replicas renew their shares of every backend's KV
budget here (`gpupool.core.kvshares.ShareDelegator`), once every ``ttl_s / 3``, instead of taking a
request lease from the gateway per request.

- ``POST /v1/kv/shares`` (role admin: replicas are infrastructure, like node agents): body
  ``{"replica", "incarnation", "seq", "ttl_s", "shares": {backend id: {"hold_mib", "used_mib",
  "want_mib"}}}``; answer ``{"seq", "ttl_s", "backends": {id: {"model", "url", "node", "gpu_id",
  "kv_budget_mib", "paused", "task", "max_model_len", "priority_scheduling"}}, "shares": {id:
  {"share_mib", "target_mib"}}}`` (the backends' proxy options travel with them, so a replica's
  proxy treats each model and backend as the leader's does). 409 ``stale_seq``
  when ``seq`` is not above the last processed one of that incarnation (a delayed retry: nothing
  changes); 422 naming the field for bad input (nothing changes).
- ``DELETE /v1/kv/shares/{replica}/{incarnation}``: a replica stopping cleanly gives its shares back.
- ``GET /v1/kv/shares``: ``{"calls", "backends": {id: {"replica/incarnation": MiB}}, "budgets":
  {id: MiB}}``: each live share, the KV budgets and the number of share calls processed.

Shares are leases of the KV allocator, in memory like request leases: a new leader starts with none
and replicas re-adopt theirs on their next call when the room is still free (`kvshares`). Freed room
reaches queued requests at the controller's next tick.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, StringConstraints

from gpupool.adapters.http.auth import Principal
from gpupool.adapters.http.context import Gateway
from gpupool.adapters.http.errors import HttpError
from gpupool.adapters.http.schemas import ErrorOut, ValidationErrorOut
from gpupool.core.kvshares import (
    MAX_ID_CHARS,
    MAX_TTL_S,
    MIN_TTL_S,
    ShareDelegator,
    ShareReport,
    StaleShareReport,
)
from gpupool.core.model import MAX_VRAM_MIB

Id = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=r"^[^/\s]+$")]
Mib = Annotated[StrictInt, Field(ge=0, le=MAX_VRAM_MIB)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ShareIn(_Strict):
    hold_mib: Mib
    """The share the replica keeps, and will not exceed until this call's answer arrives."""
    used_mib: Mib
    want_mib: Mib


class SharesIn(_Strict):
    replica: Id
    incarnation: Id
    """Random per replica process start (a restarted replica's old shares just expire)."""
    seq: Annotated[StrictInt, Field(ge=0, le=2**62)]
    ttl_s: Annotated[float, Field(ge=MIN_TTL_S, le=MAX_TTL_S)]
    shares: Annotated[dict[Id, ShareIn], Field(max_length=4096)] = Field(default_factory=dict)


class BackendOut(BaseModel):
    model: str
    url: str
    node: str
    gpu_id: str
    kv_budget_mib: int
    paused: bool
    task: str | None
    max_model_len: int | None
    priority_scheduling: bool


class ShareOut(BaseModel):
    share_mib: int
    target_mib: int


class SharesOut(BaseModel):
    seq: int
    ttl_s: float
    backends: dict[str, BackendOut]
    shares: dict[str, ShareOut]


class SharesView(BaseModel):
    calls: int
    backends: dict[str, dict[str, int]]
    budgets: dict[str, int]


class ReleasedOut(BaseModel):
    released: int


def _err(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ValidationErrorOut if c == 422 else ErrorOut} for c in codes}


async def _admin(request: Request) -> Principal:
    gw: Gateway = request.app.state.gateway
    h = request.headers.get("authorization", "")
    who = gw.tokens.lookup(h[7:].strip()) if h[:7].lower() == "bearer " else None
    if who is None:
        why = "missing bearer token" if not h else "invalid token"
        raise HttpError(401, why, "unauthenticated", headers={"WWW-Authenticate": "Bearer"})
    if not who.is_admin:
        raise HttpError(403, "this route needs role admin", "forbidden")
    return who


Admin = Annotated[Principal, Depends(_admin)]


def add_share_routes(app: FastAPI, gw: Gateway) -> ShareDelegator:
    c = gw.controller

    def held() -> frozenset[str]:
        return c.queue.avoid(0) if len(c.queue) else frozenset()  # online (P0/P1) waiters' holds

    d = ShareDelegator(c.kv, backends=lambda: c.backends, held=held)
    app.state.kv_shares = d

    @app.post("/v1/kv/shares", responses=_err(400, 401, 403, 409, 413, 422) | {200: {"model": SharesOut}})
    async def renew_shares(body: SharesIn, who: Admin) -> JSONResponse:
        reports = {k: ShareReport(v.hold_mib, v.used_mib, v.want_mib) for k, v in body.shares.items()}
        try:
            grants = d.renew(body.replica, body.incarnation, body.seq, reports, ttl_s=body.ttl_s)
        except StaleShareReport as exc:
            raise HttpError(409, str(exc), "stale_seq") from None
        paused = c.paused_gpus()
        surf = getattr(app.state, "openai", None)  # the proxy's model facts and backend options
        backends = {}
        for bid, b in c.backends.items():
            card = surf.models.get(b.model) if surf is not None else None
            opts = surf.backends.get(bid) if surf is not None else None
            backends[bid] = {
                "model": b.model,
                "url": b.url,
                "node": b.node,
                "gpu_id": b.gpu_id,
                "kv_budget_mib": b.kv_budget_mib,
                "paused": b.gpu_id in paused,
                "task": card.task if card is not None else None,
                "max_model_len": card.max_model_len if card is not None else None,
                "priority_scheduling": bool(opts is not None and opts.priority_scheduling),
            }
        shares = {bid: {"share_mib": g.share_mib, "target_mib": g.target_mib} for bid, g in grants.items()}
        return JSONResponse({"seq": body.seq, "ttl_s": body.ttl_s, "backends": backends, "shares": shares})

    @app.delete(
        "/v1/kv/shares/{replica}/{incarnation}", responses=_err(401, 403, 422) | {200: {"model": ReleasedOut}}
    )
    async def release_shares(replica: str, incarnation: str, who: Admin) -> JSONResponse:
        return JSONResponse({"released": d.release_all(replica, incarnation)})

    @app.get("/v1/kv/shares", responses=_err(401, 403) | {200: {"model": SharesView}})
    async def list_shares(who: Admin) -> JSONResponse:
        view = {bid: d.shares(bid) for bid in sorted(c.backends)}
        budgets = {bid: b.kv_budget_mib for bid, b in c.backends.items()}
        return JSONResponse({"calls": d.calls, "backends": view, "budgets": budgets})

    return d
