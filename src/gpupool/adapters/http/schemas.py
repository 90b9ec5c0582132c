"""Pydantic request/response schemas of the gateway's JSON API (the OpenAPI document is built from them).

Unknown fields are rejected (``extra="forbid"``) and numbers are strict and bounded, so that malformed
input is a 422 naming the field, never a 5xx. pydantic lives only in this adapter.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gpupool.core.model import MAX_GPU_COUNT, MAX_TTL_S, MAX_VRAM_MIB

Kind = Literal["mig", "mps", "whole", "time-slice"]
MAX_TOKENS = 10_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LeaseIn(_Strict):
    """Either an explicit size (``vram_mib`` [+ ``compute_pct``]) or a model + token counts."""

    priority: StrictInt | StrictStr = Field("P1", description="P0|P1|P2 or an integer (higher = more urgent)")
    vram_mib: StrictInt | None = Field(None, ge=1, le=MAX_VRAM_MIB)
    compute_pct: StrictInt | None = Field(None, ge=0, le=100)
    compute_milli: StrictInt | None = Field(None, ge=0, le=1000)
    ttl_s: float = Field(60.0, gt=0, le=MAX_TTL_S)
    kinds: list[Kind] = Field(default_factory=list, max_length=4)
    gpu_count: StrictInt = Field(1, ge=1, le=MAX_GPU_COUNT)
    gpu_id: StrictStr | None = Field(None, max_length=256)
    nodes: list[StrictStr] = Field(default_factory=list, max_length=1024)
    preemptible: StrictBool | None = None
    model: StrictStr | None = Field(None, min_length=1, max_length=256)
    prompt_tokens: StrictInt | None = Field(None, ge=0, le=MAX_TOKENS)
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS)
    queue_timeout_s: float | None = Field(None, gt=0, le=3600)
    wait_s: float = Field(0.0, ge=0, le=60, description="long-poll: wait up to this long for a queued grant")
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict, max_length=64)


class RenewIn(_Strict):
    ttl_s: float | None = Field(None, gt=0, le=MAX_TTL_S)


class GrantOut(BaseModel):
    slice_id: str
    gpu_id: str
    vram_mib: int
    compute_milli: int


class LeaseOut(BaseModel):
    id: str
    state: str
    tenant: str
    priority: int
    node: str
    slice_id: str
    gpu_id: str
    vram_mib: int
    compute_milli: int
    grants: list[GrantOut]
    granted_at: float
    expires_at: float
    revision: int
    model: str = ""
    backend: str = ""
    reason: str = ""
    labels: dict[str, str] = {}
    early_warning: bool = False
    victims: list[str] = []


class TicketOut(BaseModel):
    ticket: str
    state: Literal["queued", "granted", "shed", "cancelled", "failed"]
    enqueued_at: float
    deadline_at: float
    lease: LeaseOut | None = None
    reason: str = ""


class ErrorOut(BaseModel):
    error: str
    code: str
    field: str | None = None
    retry_after_s: float | None = None


class GpuReadingIn(_Strict):
    gpu_id: StrictStr = Field(..., min_length=1, max_length=256)
    vram_used_mib: StrictInt = Field(..., ge=0, le=MAX_VRAM_MIB)
    vram_total_mib: StrictInt = Field(..., ge=1, le=MAX_VRAM_MIB)
    temperature_c: StrictInt | None = Field(None, ge=-50, le=200)
    util_pct: StrictInt | None = Field(None, ge=0, le=100)
    health: Literal["ok", "degraded", "failed"] = "ok"
    xids: list[StrictInt] = Field(default_factory=list, max_length=64)


class ReadingsIn(_Strict):
    """What a node agent pushes every tick: one entry per GPU of that node."""

    gpus: list[GpuReadingIn] = Field(..., min_length=1, max_length=64)


class AgentEventIn(_Strict):
    seq: StrictInt = Field(..., ge=0)
    kind: StrictStr = Field(..., min_length=1, max_length=64)
    at_s: float = 0.0
    gpu_id: StrictStr = Field("", max_length=256)
    lease_id: StrictStr = Field("", max_length=256)
    reason: StrictStr = Field("", max_length=2048)
    pauser: StrictStr = Field("", max_length=64)
    frees: StrictStr = Field("", max_length=64)
    latency_ms: float = Field(0.0, ge=0)


class AgentWorkloadIn(_Strict):
    lease_id: StrictStr = Field(..., max_length=256)
    gpu_id: StrictStr = Field(..., max_length=256)
    state: StrictStr = Field(..., max_length=64)


class NodeEventsIn(_Strict):
    """What a node agent reports besides readings: its pause/resume/revoke decisions."""

    resync: StrictBool = False
    dropped_events: StrictInt = Field(0, ge=0)
    workloads: list[AgentWorkloadIn] = Field(default_factory=list, max_length=4096)
    events: list[AgentEventIn] = Field(default_factory=list, max_length=1024)


class WatermarksIn(_Strict):
    vram_high: float = Field(0.88, ge=0, le=1)
    vram_low: float = Field(0.70, ge=0, le=1)
    temp_high_c: StrictInt = Field(80, ge=0, le=150)
    temp_low_c: StrictInt = Field(75, ge=0, le=150)
    early_warning: float = Field(0.85, ge=0, le=1)


class DrainIn(_Strict):
    revoke: StrictBool = False
    undo: StrictBool = False
    reason: StrictStr = Field("", max_length=512)


class SliceHealthIn(_Strict):
    healthy: StrictBool
    revoke: StrictBool = False
    reason: StrictStr = Field("", max_length=512)


JSON = dict[str, Any]
