"""From a raw GPU sample + engine metrics + the lease ledger to the `Reading` the watermark machine eats.

Role: pure functions (no I/O, no clock) that decide what "VRAM used" means for backpressure, and
which device errors make a GPU unhealthy.

Why not NVML alone (gateway.md 6.2): a vLLM-style engine reserves ~90 % of the card at start, so NVML
"used" is flat and a fixed 88 % watermark would pause batch work forever. The effective use is

    effective = max(nvml_used - sum(engine_reserved * (1 - kv_cache_usage)), ledger_granted_mib)

i.e. the unused part of each engine's KV pool counts as free, and the gateway's lease ledger (the
source of truth for granted VRAM) is a floor. An engine with ``num_requests_waiting`` at or above
``waiting_saturated`` is saturated (its whole reservation counts as used). Engine metrics older than
``engine_max_age_s`` fail closed: that engine's reservation counts as fully used.

Invariants: results are integers in MiB, ``0 <= effective_used_mib``; the temperature is passed
through unchanged. A sample with more VRAM used than the GPU has is refused by `within_capacity`
(the loop counts it as full and reports it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpupool.agent.source import GpuSample
from gpupool.agent.workloads import Entry
from gpupool.core.pausers import Candidate, Frees, Pauser
from gpupool.core.watermarks import Reading

APP_LEVEL_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by the application, not the device (the NVIDIA k8s device plugin skips the same set);
every other XID marks the GPU unhealthy."""


@dataclass(frozen=True, slots=True)
class EngineView:
    """One engine on one GPU as the tick sees it."""

    endpoint: str
    reserved_mib: int
    kv_usage: float | None
    """0..1, None = no fresh metrics (fail closed)."""
    requests_waiting: int = 0
    age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PressureConfig:
    waiting_saturated: int = 5
    """Waiting requests per engine at which it counts as saturated (EPP's default threshold)."""
    engine_max_age_s: float = 1.0


def engine_slack_mib(engines: Iterable[EngineView], cfg: PressureConfig) -> int:
    slack = 0
    for e in engines:
        if e.kv_usage is None or e.age_s > cfg.engine_max_age_s:
            continue
        if e.requests_waiting >= cfg.waiting_saturated:
            continue
        slack += int(e.reserved_mib * (1.0 - min(max(e.kv_usage, 0.0), 1.0)))
    return slack


def effective_used_mib(
    sample: GpuSample, engines: Iterable[EngineView] = (), *, ledger_mib: int = 0, cfg: PressureConfig
) -> int:
    used = max(0, sample.vram_used_mib - engine_slack_mib(engines, cfg))
    return max(used, ledger_mib)


def to_reading(
    sample: GpuSample,
    *,
    at_s: float,
    engines: Iterable[EngineView] = (),
    ledger_mib: int = 0,
    cfg: PressureConfig,
) -> Reading:
    return Reading(
        sample.gpu_id,
        effective_used_mib(sample, engines, ledger_mib=ledger_mib, cfg=cfg),
        sample.vram_total_mib,
        at_s,
        temperature_c=sample.temperature_c,
        util_pct=sample.util_pct,
    )


def within_capacity(sample: GpuSample) -> tuple[GpuSample, str]:
    """(the sample, '') when its memory is plausible; else the sample counted as full (used = total:
    fail closed) and why (a GPU cannot use more memory than it has: a broken or forged read)."""
    if sample.error or sample.vram_used_mib <= sample.vram_total_mib:
        return sample, ""
    why = (
        f"GPU {sample.gpu_id}: invalid reading vram_used_mib={sample.vram_used_mib} >"
        f" vram_total_mib={sample.vram_total_mib}: counted as full"
    )
    return replace(sample, vram_used_mib=sample.vram_total_mib), why


def health_problem(sample: GpuSample, *, app_xids: frozenset[int] = APP_LEVEL_XIDS) -> str:
    """'' when healthy, else why the GPU must be marked unhealthy."""
    if sample.error:
        return f"NVML error: {sample.error}"
    fatal = [x for x in sample.xids if x not in app_xids]
    if fatal:
        return "XID " + ",".join(str(x) for x in fatal)
    return ""


def relief_candidates(
    entries: Sequence[Entry], sample: GpuSample, pausers: Mapping[str, Pauser], failed: Mapping[str, str]
) -> list[Candidate]:
    """What `plan_relief` may pause or revoke on one GPU: each workload's VRAM (the larger of its
    lease and what its processes use now; 0 once freed), its pauser's effect and time to free, and
    why it may not be paused (its pauser's refusal, or a pause of it that failed: ``failed``)."""
    used_by_pid = {p.pid: p.used_mib for p in sample.processes}
    out = []
    for e in entries:
        w = e.workload
        pids = w.pids or ((w.pgid,) if w.pgid is not None else ())
        measured = sum(used_by_pid.get(pid, 0) for pid in pids)
        p = pausers.get(w.pauser)
        if p is None:
            out.append(
                Candidate(
                    w.lease_id,
                    w.priority,
                    max(w.vram_mib, measured),
                    Frees.COMPUTE,
                    math.inf,
                    f"unknown pauser {w.pauser!r}",
                )
            )
            continue
        vram = 0 if e.vram_freed else max(w.vram_mib, measured)
        refusal = p.check(w) or failed.get(w.lease_id)
        out.append(Candidate(w.lease_id, w.priority, vram, p.frees, p.vram_free_estimate_s, refusal))
    return out
