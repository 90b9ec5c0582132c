"""Pydantic request/response schemas of the gateway's JSON API (the OpenAPI document is built from them).

Unknown fields are rejected (``extra="forbid"``) and numbers are strict and bounded, so that malformed
input is a 422 naming the field, never a 5xx. pydantic lives only in this adapter.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from gpupool.core.model import MAX_GPU_COUNT, MAX_TTL_S, MAX_VRAM_MIB

Kind = Literal["mig", "mps", "whole", "time-slice"]
MAX_TOKENS = 10_000_000
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 1024
LabelKey = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_LABEL_KEY_CHARS)]
LabelValue = Annotated[StrictStr, StringConstraints(max_length=MAX_LABEL_VALUE_CHARS)]
PRIORITY_DOC = (
    "P0|P1|P2 or an integer (higher = more urgent). The named bands map to integers: "
    "P0 = 100 (online agent interaction), P1 = 50 (online embedding / retrieval), "
    "P2 = -1 (offline batch, preemptible by default). Responses carry both: `priority` (the integer) "
    "and `band` (P0 for >= 100, P1 for 0..99, P2 below 0)."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LeaseIn(_Strict):
    """Either an explicit size (``vram_mib`` [+ ``compute_pct``]) or a model + token counts."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"priority": "P1", "vram_mib": 2048, "ttl_s": 60}]},
    )

    priority: StrictInt | StrictStr = Field("P1", description=PRIORITY_DOC)
    vram_mib: StrictInt | None = Field(None, ge=1, le=MAX_VRAM_MIB)
    compute_pct: StrictInt | None = Field(None, ge=0, le=100)
    compute_milli: StrictInt | None = Field(None, ge=0, le=1000)
    ttl_s: StrictFloat = Field(60.0, gt=0, le=MAX_TTL_S)
    kinds: list[Kind] = Field(default_factory=list, max_length=4)
    gpu_count: StrictInt = Field(1, ge=1, le=MAX_GPU_COUNT)
    gpu_id: StrictStr | None = Field(None, max_length=256)
    nodes: list[StrictStr] = Field(default_factory=list, max_length=1024)
    preemptible: StrictBool | None = None
    model: StrictStr | None = Field(None, min_length=1, max_length=256)
    prompt_tokens: StrictInt | None = Field(None, ge=0, le=MAX_TOKENS)
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS)
    queue_timeout_s: StrictFloat | None = Field(None, gt=0, le=3600)
    wait_s: StrictFloat = Field(
        0.0,
        ge=0,
        le=60,
        description="long-poll: wait up to this long for a queued grant; a client that hangs up "
        "meanwhile never learns the ticket, so it is cancelled (a lease granted meanwhile released)",
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description=f"at most {MAX_LABELS} labels; keys 1-{MAX_LABEL_KEY_CHARS} characters, "
        f"values up to {MAX_LABEL_VALUE_CHARS}",
    )


class RenewIn(_Strict):
    ttl_s: StrictFloat | None = Field(None, gt=0, le=MAX_TTL_S)


class GrantOut(BaseModel):
    slice_id: str
    gpu_id: str
    vram_mib: int
    compute_milli: int


class LeaseOut(BaseModel):
    id: str
    state: str
    tenant: str
    priority: int = Field(..., description=PRIORITY_DOC)
    band: Literal["P0", "P1", "P2"] = Field(..., description="the priority's band name (see `priority`)")
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
    victims: list[str] = Field(
        [], description="ids of the caller's own leases preempted for this grant (all of them for an admin)"
    )
    victims_other_tenants: int = Field(
        0, description="how many other tenants' leases were preempted for this grant (ids not shown)"
    )
    device_state: Literal["usable", "granted-pending-free", "free-failed"] = Field(
        "usable",
        description="``granted-pending-free`` while the node agent is still freeing the memory of the "
        "leases preempted for this grant (do not start on the GPU yet); ``free-failed`` when that memory "
        "did not come back by the agent's deadline",
    )


class LeasesOut(BaseModel):
    leases: list[LeaseOut]


class TicketOut(BaseModel):
    ticket: str
    state: Literal["queued", "granted", "shed", "cancelled", "failed"]
    enqueued_at: float
    deadline_at: float
    lease: LeaseOut | None = None
    reason: str = ""
    poll: str | None = None


class ErrorOut(BaseModel):
    error: str
    code: str
    field: str | None = None
    retry_after_s: float | None = None


class ValidationDetail(BaseModel):
    loc: list[str]
    msg: str
    type: str


class ValidationErrorOut(ErrorOut):
    detail: list[ValidationDetail] = []


class RenewConflictOut(ErrorOut):
    lease: LeaseOut


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class OpenAIErrorOut(BaseModel):
    error: OpenAIErrorBody


class HealthOut(BaseModel):
    ok: bool
    store_error: str | None = Field(None, description="the lease store's error while it refuses writes")


class NoopOut(BaseModel):
    id: str
    tenant: str = ""
    state: str = ""


class SignalOut(BaseModel):
    gpu_id: str
    signal: str
    lease_ids: list[str]


class ReadingsOut(BaseModel):
    accepted: int
    signals: list[SignalOut]
    paused_gpus: list[str]


class NodeEventsOut(BaseModel):
    accepted: int
    revoked: list[str]


class DrainOut(BaseModel):
    gpu_id: str
    drained: bool
    leases: list[str]


class SliceHealthOut(BaseModel):
    slice_id: str
    healthy: bool
    leases: list[str]


class GpuReadingIn(_Strict):
    gpu_id: StrictStr = Field(..., min_length=1, max_length=256)
    vram_total_mib: StrictInt = Field(..., ge=1, le=MAX_VRAM_MIB)
    vram_used_mib: StrictInt = Field(..., ge=0, le=MAX_VRAM_MIB)
    """At most ``vram_total_mib`` (validated after it: fields validate in declaration order)."""
    temperature_c: StrictInt | None = Field(None, ge=-50, le=200)
    util_pct: StrictInt | None = Field(None, ge=0, le=100)
    health: Literal["ok", "degraded", "failed"] = "ok"
    xids: list[Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]] = Field(default_factory=list, max_length=64)

    @field_validator("vram_used_mib")
    @classmethod
    def _within_the_gpu(cls, used: int, info: ValidationInfo) -> int:
        total = info.data.get("vram_total_mib")
        if total is not None and used > total:  # a GPU cannot use more than it has: a broken read
            raise ValueError(f"must be <= vram_total_mib={total}")
        return used


class ReadingsIn(_Strict):
    """What a node agent pushes every tick: one entry per GPU of that node."""

    gpus: list[GpuReadingIn] = Field(..., min_length=1, max_length=64)

    @field_validator("gpus")
    @classmethod
    def _one_entry_per_gpu(cls, gpus: list[GpuReadingIn]) -> list[GpuReadingIn]:
        seen: set[str] = set()
        for g in gpus:
            if g.gpu_id in seen:  # (read as the last entry before: which one is true?)
                raise ValueError(f"GPU {g.gpu_id!r} appears twice in one batch")
            seen.add(g.gpu_id)
        return gpus


class NodeSliceIn(_Strict):
    """One slice of a node as its agent discovered it (the ``<domain>/slices`` annotation's fields)."""

    id: StrictStr = Field(..., min_length=1, max_length=256)
    gpu_id: StrictStr = Field(..., min_length=1, max_length=256)
    kind: Kind
    vram_mib: StrictInt = Field(..., ge=1, le=MAX_VRAM_MIB)
    compute_milli: StrictInt = Field(..., ge=0, le=1000)
    index: StrictInt = Field(0, ge=0, le=1023)
    model: StrictStr = Field("", max_length=128)
    profile: StrictStr = Field("", max_length=128)
    uuid: StrictStr = Field("", max_length=128)
    healthy: StrictBool = True
    mps_pipe_dir: StrictStr = Field("", max_length=4096)


class NodeSlicesIn(_Strict):
    """The whole slice list of one node (state, not a delta): what is not listed is gone."""

    slices: list[NodeSliceIn] = Field(..., max_length=4096)


class NodeSlicesOut(BaseModel):
    node: str
    slices: int
    added: list[str]
    removed: list[str]
    health: list[str]
    revoked: list[str]


class AgentEventIn(_Strict):
    seq: StrictInt = Field(..., ge=0)
    kind: StrictStr = Field(..., min_length=1, max_length=64)
    at_s: StrictFloat = 0.0
    gpu_id: StrictStr = Field("", max_length=256)
    lease_id: StrictStr = Field("", max_length=256)
    reason: StrictStr = Field("", max_length=2048)
    pauser: StrictStr = Field("", max_length=64)
    frees: StrictStr = Field("", max_length=64)
    latency_ms: StrictFloat = Field(0.0, ge=0)


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
    """``PUT``: the whole configuration, every field required (``PATCH`` changes some)."""

    vram_high: StrictFloat = Field(..., ge=0, le=1, description="PAUSE at or above this VRAM fraction")
    vram_low: StrictFloat = Field(..., ge=0, le=1, description="RESUME at or below (< vram_high)")
    temp_high_c: StrictInt = Field(..., ge=0, le=150)
    temp_low_c: StrictInt = Field(..., ge=0, le=150, description="< temp_high_c")
    early_warning: StrictFloat = Field(..., ge=0, le=1)


class WatermarksPatch(_Strict):
    """``PATCH``: only the fields given change; the others keep their current values."""

    vram_high: StrictFloat | None = Field(None, ge=0, le=1)
    vram_low: StrictFloat | None = Field(None, ge=0, le=1)
    temp_high_c: StrictInt | None = Field(None, ge=0, le=150)
    temp_low_c: StrictInt | None = Field(None, ge=0, le=150)
    early_warning: StrictFloat | None = Field(None, ge=0, le=1)


class WatermarksOut(BaseModel):
    vram_high: float
    vram_low: float
    temp_high_c: int
    temp_low_c: int
    early_warning: float


class DrainIn(_Strict):
    revoke: StrictBool = False
    undo: StrictBool = False
    reason: StrictStr = Field("", max_length=512)


class SliceHealthIn(_Strict):
    healthy: StrictBool
    revoke: StrictBool = False
    reason: StrictStr = Field("", max_length=512)


JSON = dict[str, Any]
