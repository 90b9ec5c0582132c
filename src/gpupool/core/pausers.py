"""Pausers: how the node agent stops and restarts batch (P2) work, and what each way frees.

Role: the port between the agent's control loop and the mechanisms in ``gpupool.adapters.pause``
(POSIX signals, the cgroup v2 freezer, vLLM sleep/wake and pause/resume, cuda-checkpoint), plus the
pure decision of what to do with the P2 workloads of a GPU under pressure (`plan_relief`).

Invariants:
- A `Pauser` declares up front what a successful pause frees (`Frees.COMPUTE` or
  `Frees.COMPUTE_AND_VRAM`) and how long freeing VRAM is expected to take
  (``vram_free_estimate_s``); the gateway uses the first to decide whether a P0 may use the space.
- `Pauser.check` returns a refusal reason (MIG slice, multi-process NCCL job, missing binary, old
  driver) *before* anything is touched; ``pause``/``resume`` never raise for an expected failure,
  they return a `PauseResult` with ``ok=False`` and the reason.
- `PauseResult` carries its own start and end times, read from the clock the agent injects; this
  module never reads a clock.
- `plan_relief` is deterministic: victims are ordered by (priority ascending, VRAM descending,
  lease id ascending) -- a total order -- and the plan only depends on its arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from gpupool.core.errors import InvalidInput

PID_MAX = 2**31 - 1
"""The largest value of a POSIX ``pid_t``: a larger pgid or pid names no process, and the kill
syscalls refuse it with an error the signal paths would not expect (``OverflowError``)."""


class Frees(StrEnum):
    """What a successful pause gives back to other tenants of the GPU."""

    COMPUTE = "compute"
    """CPU threads stop, so no new kernels are launched; VRAM and the CUDA context stay."""
    COMPUTE_AND_VRAM = "compute+vram"
    """The process or engine also releases its device memory (vLLM sleep, cuda-checkpoint)."""

    @property
    def frees_vram(self) -> bool:
        return self is Frees.COMPUTE_AND_VRAM


class PauseAction(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    TERMINATE = "terminate"


@dataclass(frozen=True, slots=True)
class Workload:
    """A P2 job the agent may pause: where it runs, how to reach it and which pauser to use.

    Only the fields the chosen pauser needs must be set: ``pgid``/``pids`` for signals,
    ``cgroup`` for the freezer, ``endpoint`` for vLLM, ``pids`` for cuda-checkpoint.
    """

    lease_id: str
    gpu_id: str
    pauser: str
    """Name of the pauser (``signal``, ``cgroup``, ``vllm-sleep``, ``vllm-pause``, ``cuda-checkpoint``)."""
    priority: int = -1
    vram_mib: int = 0
    """Device memory the workload holds (granted or measured); what a VRAM-freeing pause returns."""
    pgid: int | None = None
    pids: tuple[int, ...] = ()
    cgroup: str = ""
    endpoint: str = ""
    on_mig: bool = False
    nccl_world_size: int = 1
    """Processes in the job's NCCL communicator; > 1 is a multi-process NCCL job."""
    sleep_level: int = 1
    labels: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.lease_id:
            raise InvalidInput("workload.lease_id", self.lease_id, "must be a non-empty string")
        if not self.gpu_id:
            raise InvalidInput("workload.gpu_id", self.gpu_id, "must be a non-empty string")
        if not self.pauser:
            raise InvalidInput("workload.pauser", self.pauser, "must name a pauser")
        if type(self.vram_mib) is not int or self.vram_mib < 0:
            raise InvalidInput("workload.vram_mib", self.vram_mib, "must be an integer >= 0")
        if self.pgid is not None and (type(self.pgid) is not int or not 1 < self.pgid <= PID_MAX):
            raise InvalidInput("workload.pgid", self.pgid, f"must be an integer in [2, {PID_MAX}]")
        for pid in self.pids:
            if type(pid) is not int or not 1 < pid <= PID_MAX:
                raise InvalidInput("workload.pids", pid, f"every pid must be an integer in [2, {PID_MAX}]")
        if self.sleep_level not in (1, 2):
            raise InvalidInput("workload.sleep_level", self.sleep_level, "must be 1 or 2")
        if type(self.nccl_world_size) is not int or self.nccl_world_size < 1:
            raise InvalidInput("workload.nccl_world_size", self.nccl_world_size, "must be an integer >= 1")


@dataclass(frozen=True, slots=True)
class PauseResult:
    """What one pause / resume / terminate did, with its timing on the agent's clock."""

    lease_id: str
    pauser: str
    action: PauseAction
    ok: bool
    frees: Frees
    started_at_s: float
    finished_at_s: float
    reason: str = ""
    refused: bool = False
    """True when `Pauser.check` said no and nothing was touched."""
    vram_freed_mib: int = 0

    @property
    def latency_ms(self) -> float:
        return max(0.0, (self.finished_at_s - self.started_at_s) * 1000.0)


@runtime_checkable
class Pauser(Protocol):
    """One way of pausing a workload. Implementations live in ``gpupool.adapters.pause``."""

    @property
    def name(self) -> str: ...

    @property
    def frees(self) -> Frees: ...

    @property
    def vram_free_estimate_s(self) -> float:
        """Expected seconds until VRAM is back after ``pause``; ``inf`` when it never frees VRAM."""
        ...

    def check(self, workload: Workload) -> str | None:
        """None when this pauser can handle ``workload``; otherwise the reason it refuses."""
        ...

    def pause(self, workload: Workload) -> PauseResult: ...

    def resume(self, workload: Workload) -> PauseResult: ...

    def terminate(self, workload: Workload) -> PauseResult:
        """End the workload for good (its lease was revoked); ``ok=False`` when not applicable."""
        ...

    def is_paused(self, workload: Workload) -> bool: ...


# ---------------------------------------------------------------------------------------- relief plan
class ReliefStep(StrEnum):
    PAUSE = "pause"
    """Pause with the workload's pauser (and count what it frees)."""
    REVOKE = "revoke"
    """No pauser frees its VRAM in time: revoke the lease (the gateway requeues the job)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One P2 workload as `plan_relief` sees it."""

    lease_id: str
    priority: int
    vram_mib: int
    frees: Frees
    vram_free_estimate_s: float
    refusal: str | None = None
    """Why its pauser refuses it (then it can only be revoked)."""


@dataclass(frozen=True, slots=True)
class Decision:
    lease_id: str
    step: ReliefStep
    reason: str


def victim_order(c: Candidate) -> tuple[int, int, str]:
    """Lowest priority first, then the largest VRAM holder, then lease id (total order)."""
    return (c.priority, -c.vram_mib, c.lease_id)


def vram_deficit_mib(used_mib: int, total_mib: int, *, target_ratio: float) -> int:
    """MiB to free so that ``used`` drops strictly below ``target_ratio`` of ``total`` (>= 0)."""
    if not 0.0 <= target_ratio <= 1.0 or not math.isfinite(target_ratio):
        raise InvalidInput("target_ratio", target_ratio, "must be a number in [0, 1]")
    limit_mib = (round(target_ratio * 1000) * total_mib + 999) // 1000  # ceil(target * total)
    return max(0, min(used_mib, used_mib - limit_mib + 1))


def plan_relief(
    candidates: Iterable[Candidate], *, deficit_mib: int, budget_s: float
) -> tuple[Decision, ...]:
    """Decide, for every P2 workload on one GPU under pressure, pause or revoke.

    Every candidate whose pauser accepts it is paused (that always stops its compute). VRAM-freeing
    pauses that finish within ``budget_s`` count against ``deficit_mib`` in `victim_order`. If the
    deficit is still positive, candidates that cannot free VRAM in time (compute-only pauser, slow
    VRAM pauser, or a refusal) are revoked in `victim_order` until it is covered. A refused
    candidate that is not needed for the deficit is left alone (step PAUSE is not possible for it,
    so it gets no decision). Returns the decisions in `victim_order`.
    """
    if deficit_mib < 0:
        raise InvalidInput("deficit_mib", deficit_mib, "must be >= 0")
    ordered = sorted(candidates, key=victim_order)
    remaining = deficit_mib
    in_time: set[str] = set()
    for c in ordered:
        if c.refusal is None and c.frees.frees_vram and c.vram_free_estimate_s <= budget_s:
            in_time.add(c.lease_id)
            remaining -= c.vram_mib
    revoke: dict[str, str] = {}
    for c in ordered:
        if remaining <= 0:
            break
        if c.lease_id in in_time or c.vram_mib <= 0:
            continue
        if c.refusal is not None:
            why = f"pauser refuses ({c.refusal})"
        elif not c.frees.frees_vram:
            why = "pauser frees compute only"
        else:
            why = f"pauser needs ~{c.vram_free_estimate_s:.1f} s > budget {budget_s:.1f} s"
        revoke[c.lease_id] = f"revoke: {why}; {remaining} MiB still needed"
        remaining -= c.vram_mib
    out: list[Decision] = []
    for c in ordered:
        if c.lease_id in revoke:
            out.append(Decision(c.lease_id, ReliefStep.REVOKE, revoke[c.lease_id]))
        elif c.refusal is None:
            what = "frees VRAM in time" if c.lease_id in in_time else "stops compute"
            out.append(Decision(c.lease_id, ReliefStep.PAUSE, f"pause: {what}"))
    return tuple(out)


def candidates_from(
    workloads: Sequence[Workload], pausers: dict[str, Pauser], *, unknown_reason: str = "unknown pauser"
) -> tuple[Candidate, ...]:
    """Turn workloads into `Candidate` values using their named pausers' declarations."""
    out: list[Candidate] = []
    for w in workloads:
        p = pausers.get(w.pauser)
        if p is None:
            out.append(Candidate(w.lease_id, w.priority, w.vram_mib, Frees.COMPUTE, math.inf, unknown_reason))
            continue
        out.append(
            Candidate(
                w.lease_id,
                w.priority,
                w.vram_mib,
                p.frees,
                p.vram_free_estimate_s,
                p.check(w),
            )
        )
    return tuple(out)
