"""The batch queue's routes on the gateway (``gpupool serve`` / ``run`` mount them when tidal is on).

- ``POST /v1/batch/jobs`` ``{"id"?, "command": [argv...], "vram_mib", "compute_pct"?, "checkpointable"?,
  "deadline_s"?, "tenant"?}`` -> 201 the job (state ``queued``); 422 names a bad field, 409 a duplicate id,
  400 a body the bounded decoder (`jsonbody`) refuses (not JSON, nested too deep, a lone surrogate);
- ``GET /v1/batch/jobs`` -> ``{"jobs": [...]}`` in queue order (``?state=queued|running|...``);
- ``GET /v1/batch/jobs/{id}``; ``DELETE /v1/batch/jobs/{id}`` -> the job, now ``cancelled`` (its
  process stopped, its P2 lease released: answered once a process that ignores SIGTERM is killed
  after the grace period, other requests served meanwhile); 409 when it had already ended. ``{id}``
  is the rest of the path, percent-decoded, so every id ``POST`` accepts (``/`` included) can be named.

Role ``admin`` only: a job is a command the gateway's host runs, so submitting one is running code
there. Each running job holds a P2 lease through the same admission as every other lease (the tidal
DAY reservation applies). This module imports only the core: the queue and runner behind it are
reached through the `BatchPort` the composition root puts on ``app.state.batch``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from gpupool.adapters.http import jsonbody
from gpupool.adapters.http.app import admin_principal
from gpupool.adapters.http.auth import Principal
from gpupool.adapters.http.errors import BadEncoding, BadJson, HttpError, unsupported_encoding
from gpupool.core.errors import DuplicateId, InvalidInput
from gpupool.core.tidal.jobs import BatchJobSpec, JobState, validate_job
from gpupool.hardware.units import compute_milli_from_pct

AdminWho = Annotated[Principal, Depends(admin_principal)]


class BatchPort(Protocol):
    def submit(self, spec: BatchJobSpec) -> dict[str, Any]: ...
    def jobs(self, state: JobState | None = None) -> list[dict[str, Any]]: ...
    def job(self, job_id: str) -> dict[str, Any]: ...
    async def cancel(self, job_id: str) -> dict[str, Any]: ...


FIELDS = frozenset({"id", "command", "vram_mib", "compute_pct", "checkpointable", "deadline_s", "tenant"})


def spec_from_json(body: object) -> BatchJobSpec:
    """The job spec of a request body; `InvalidInput` names the first bad field."""
    if not isinstance(body, dict):
        raise InvalidInput("body", type(body).__name__, "must be a JSON object")
    for k in body:
        if k not in FIELDS:
            raise InvalidInput(str(k), body[k], "unknown field")
    cmd = body.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) and a for a in cmd):
        raise InvalidInput("command", cmd, "must be a non-empty list of non-empty strings (argv, no shell)")
    pct = body.get("compute_pct", 0)
    if type(pct) is not int or not 0 <= pct <= 100:
        raise InvalidInput("compute_pct", pct, "must be an integer in [0, 100]")
    vram = body.get("vram_mib")
    if type(vram) is not int or vram <= 0:
        raise InvalidInput("vram_mib", vram, "must be a positive integer (MiB)")
    tenant = body.get("tenant", "batch")
    if not isinstance(tenant, str) or not tenant:
        raise InvalidInput("tenant", tenant, "must be a non-empty string")
    job_id = body.get("id", f"job-{uuid.uuid4().hex[:12]}")
    spec = BatchJobSpec(
        id=job_id,
        vram_mib=vram,
        command=tuple(cmd),
        checkpointable=body.get("checkpointable", False),
        deadline_s=body.get("deadline_s"),
        compute_milli=compute_milli_from_pct(pct),
        tenant=tenant,
    )
    return validate_job(spec)


def add_batch_routes(app: FastAPI, port: BatchPort) -> None:
    app.state.batch = port

    @app.post("/v1/batch/jobs", status_code=201)
    async def submit(request: Request, who: AdminWho) -> JSONResponse:
        enc = unsupported_encoding(request.headers.get("content-encoding"))
        if enc is not None:
            raise BadEncoding(enc)
        try:  # the bounded decoder: too deep, a lone surrogate or bad JSON is a 400 naming it
            body = jsonbody.loads(await request.body(), unique_keys=True)
        except jsonbody.JsonBodyError as exc:
            raise BadJson(exc) from None
        try:
            return JSONResponse(port.submit(spec_from_json(body)), status_code=201)
        except DuplicateId as exc:
            raise HttpError(409, str(exc), "duplicate_id", field="id") from None

    @app.get("/v1/batch/jobs")
    async def list_jobs(who: AdminWho, state: str | None = Query(None)) -> JSONResponse:
        st = None
        if state is not None:
            try:
                st = JobState(state)
            except ValueError:
                raise InvalidInput(
                    "state", state, f"must be one of {', '.join(s.value for s in JobState)}"
                ) from None
        return JSONResponse({"jobs": port.jobs(st)})

    @app.get("/v1/batch/jobs/{job_id:path}")  # (an id may hold a "/")
    async def get_job(job_id: str, who: AdminWho) -> JSONResponse:
        return JSONResponse(port.job(job_id))

    @app.delete("/v1/batch/jobs/{job_id:path}")  # (an id may hold a "/")
    async def cancel_job(job_id: str, who: AdminWho) -> JSONResponse:
        try:
            return JSONResponse(await port.cancel(job_id))
        except InvalidInput as exc:
            raise HttpError(409, str(exc), "job_ended", field="id") from None


__all__ = ["BatchPort", "add_batch_routes", "spec_from_json"]
