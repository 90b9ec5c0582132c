"""Batch (P2) jobs as first-class values: the job spec, its states, its queue order and its lease.

Role: the pure half of the batch queue (issue 8, section 4). Adapters persist jobs
(``gpupool.adapters.batch.queue``) and run them (local subprocesses, Ray); this module only says
what a valid job is, which job runs next and what lease a running job holds.

Invariants:
- A job runs either a ``command`` (argv list, no shell) or a ``ray_task`` (``module:function``),
  never both; ``vram_mib`` in [1, `MAX_VRAM_MIB`]; ``deadline_s`` (Unix seconds) is finite when given;
  ``id`` holds no NUL (the job sees it in its environment); a valid job's lease request is a
  valid core request (`validate_job` checks it at submission).
- Every running job holds exactly one P2 lease (`lease_request`): preemptible, priority ``P2``.
- State machine: QUEUED -> RUNNING -> {DONE, FAILED}; QUEUED -> FAILED (a stored job that no lease
  can carry, e.g. queued before a check existed: failed with the reason, never retried at every
  step); QUEUED|RUNNING|PAUSED -> CANCELLED (an
  operator's cancel: its process is stopped and its lease released); RUNNING <-> PAUSED (a pauser that keeps
  state: SIGSTOP, vLLM sleep, cuda-checkpoint); RUNNING|PAUSED -> QUEUED (requeue when the pauser
  cannot keep state, or after a crash: never silently dropped). `check_transition` enforces it.
- Queue order is total: earliest deadline first (no deadline sorts last), then submission time,
  then job id (`queue_key`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.core.model import MAX_VRAM_MIB, Request, validate_request
from gpupool.core.priority import P2
from gpupool.core.tidal.numbers import finite_number
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ALLOWED = {
    (JobState.QUEUED, JobState.RUNNING),
    (JobState.RUNNING, JobState.DONE),
    (JobState.RUNNING, JobState.FAILED),
    (JobState.RUNNING, JobState.PAUSED),
    (JobState.PAUSED, JobState.RUNNING),
    (JobState.RUNNING, JobState.QUEUED),
    (JobState.PAUSED, JobState.QUEUED),
    (JobState.PAUSED, JobState.FAILED),
    (JobState.QUEUED, JobState.FAILED),
    (JobState.QUEUED, JobState.CANCELLED),
    (JobState.RUNNING, JobState.CANCELLED),
    (JobState.PAUSED, JobState.CANCELLED),
}
FINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
"""States a job never leaves."""


def check_transition(job_id: str, old: JobState, new: JobState) -> None:
    if (old, new) not in _ALLOWED:
        raise InvalidInput("state", new.value, f"job {job_id}: {old.value} -> {new.value} is not allowed")


@dataclass(frozen=True, slots=True)
class BatchJobSpec:
    id: str
    vram_mib: int
    command: tuple[str, ...] = ()
    ray_task: str = ""
    """``package.module:function``; called with ``args`` on the Ray cluster."""
    args: tuple[str, ...] = ()
    checkpointable: bool = False
    """True when pausing keeps its progress (it resumes); False: a pause means requeue."""
    deadline_s: float | None = None
    compute_milli: int = 0
    tenant: str = "batch"
    tokens: int = 0
    """Work size in tokens (for reporting throughput), 0 when unknown."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as a durable queue holds it (the SQLite and the etcd queue keep the same fields)."""

    spec: BatchJobSpec
    state: JobState
    submitted_at: float
    attempts: int
    lease_id: str
    worker: str
    reason: str
    returncode: int | None


def spec_from_dict(d: dict[str, Any]) -> BatchJobSpec:
    """A spec back from its stored JSON object (``dataclasses.asdict`` of it: lists become tuples)."""
    return BatchJobSpec(**{**d, "command": tuple(d["command"]), "args": tuple(d["args"])})


def validate_job(spec: BatchJobSpec) -> BatchJobSpec:
    """Raise `InvalidInput` naming the first bad field; return the spec otherwise."""
    if not isinstance(spec.id, str) or not spec.id or len(spec.id) > 200:
        raise InvalidInput("id", spec.id, "must be a non-empty string of at most 200 characters")
    if "\x00" in spec.id:  # (the job sees its id in its environment, which cannot hold a NUL byte)
        raise InvalidInput("id", spec.id, "must not contain a NUL character")
    if bool(spec.command) == bool(spec.ray_task):
        raise InvalidInput("command", list(spec.command), "give exactly one of command or ray_task")
    if spec.command and not all(isinstance(a, str) and a and "\x00" not in a for a in spec.command):
        # (an argv string cannot hold a NUL byte: the job could never be started)
        raise InvalidInput("command", list(spec.command), "must be a list of non-empty strings without NUL")
    if spec.ray_task and (spec.ray_task.count(":") != 1 or not all(spec.ray_task.split(":"))):
        raise InvalidInput("ray_task", spec.ray_task, "expected package.module:function")
    if type(spec.vram_mib) is not int or not 1 <= spec.vram_mib <= MAX_VRAM_MIB:
        raise InvalidInput("vram_mib", spec.vram_mib, f"must be an integer in [1, {MAX_VRAM_MIB}] (MiB)")
    if not isinstance(spec.tenant, str) or not spec.tenant or len(spec.tenant) > 200:
        raise InvalidInput("tenant", spec.tenant, "must be a non-empty string of at most 200 characters")
    if type(spec.compute_milli) is not int or not 0 <= spec.compute_milli <= COMPUTE_MILLI_PER_GPU:
        raise InvalidInput("compute_milli", spec.compute_milli, "must be an integer in [0, 1000]")
    if spec.deadline_s is not None and not finite_number(spec.deadline_s):
        raise InvalidInput("deadline_s", spec.deadline_s, "must be finite Unix seconds or null")
    if type(spec.tokens) is not int or spec.tokens < 0:
        raise InvalidInput("tokens", spec.tokens, "must be a non-negative integer")
    if type(spec.checkpointable) is not bool:
        raise InvalidInput("checkpointable", spec.checkpointable, "must be true or false")
    validate_request(lease_request(spec, attempt=1, ttl_s=60.0))  # what the runner will ask the core
    return spec


def queue_key(spec: BatchJobSpec, submitted_at: float) -> tuple[float, float, str]:
    """Earliest deadline first; no deadline last; then submission time; then id (total order)."""
    return (math.inf if spec.deadline_s is None else float(spec.deadline_s), submitted_at, spec.id)


def lease_request(spec: BatchJobSpec, *, attempt: int, ttl_s: float) -> Request:
    """The P2 lease a running job holds (one per attempt, so ids never repeat)."""
    return Request(
        id=f"job/{spec.id}/{attempt}",
        tenant=spec.tenant,
        priority=P2,
        demand=Resources(spec.vram_mib, spec.compute_milli),
        ttl_s=ttl_s,
        preemptible=True,
        model=spec.ray_task or (spec.command[0] if spec.command else ""),
        labels=(("job", spec.id),),
    )


__all__ = [
    "FINAL",
    "BatchJobSpec",
    "JobRecord",
    "JobState",
    "check_transition",
    "lease_request",
    "queue_key",
    "spec_from_dict",
    "validate_job",
]
