"""Values and ports of the node agent: its configuration, the events and snapshots it publishes to
observers (gateway reporter, metrics), and the Protocols of what it is fed (engine metrics, the
lease ledger, MPS limits). See `gpupool.agent.loop` for the loop itself.

Invariants: all values are frozen; `AgentEvent.seq` is assigned by the loop (one per event, from 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.agent.pressure import EngineView, PressureConfig
from gpupool.agent.source import GpuSample
from gpupool.core.errors import InvalidInput
from gpupool.core.watermarks import Reading, WatermarkConfig


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    period_s: float = 0.2
    watermarks: WatermarkConfig = field(default_factory=WatermarkConfig)
    pressure: PressureConfig = field(default_factory=PressureConfig)
    revoke_after_s: float | None = 5.0
    """How long VRAM may stay over the relief target after PAUSE before leases are revoked (None: never)."""
    relief_target: float | None = None
    """VRAM ratio the relief plan aims below; None = the high watermark."""
    retry_s: float = 1.0
    """Wait before retrying a failed or refused pause/resume of one workload."""
    workers: int = 4

    def __post_init__(self) -> None:
        if not self.node:
            raise InvalidInput("agent.node", self.node, "must be a non-empty node name")
        if not (
            isinstance(self.period_s, int | float) and math.isfinite(self.period_s) and self.period_s > 0
        ):
            raise InvalidInput("agent.period_s", self.period_s, "must be a finite number of seconds > 0")
        if self.revoke_after_s is not None and not (
            math.isfinite(self.revoke_after_s) and self.revoke_after_s >= 0
        ):
            raise InvalidInput("agent.revoke_after_s", self.revoke_after_s, "must be >= 0 seconds or None")
        if self.relief_target is not None and not 0 <= self.relief_target <= 1:
            raise InvalidInput("agent.relief_target", self.relief_target, "must be in [0, 1] or None")
        if not self.retry_s >= 0:
            raise InvalidInput("agent.retry_s", self.retry_s, "must be >= 0 seconds")
        if type(self.workers) is not int or self.workers < 1:
            raise InvalidInput("agent.workers", self.workers, "must be an integer >= 1")


@dataclass(frozen=True, slots=True)
class AgentEvent:
    seq: int
    kind: str
    """watermark_pause | watermark_resume | paused | resumed | pauser_failure | revoke | unhealthy |
    source_error | mps_applied | mps_failure | watermarks | config_error | failure_cleared (the end of
    a persisting failure, see `gpupool.agent.repeats`) ..."""
    at_s: float
    gpu_id: str = ""
    lease_id: str = ""
    reason: str = ""
    pauser: str = ""
    frees: str = ""
    latency_ms: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "at_s": self.at_s,
            "gpu_id": self.gpu_id,
            "lease_id": self.lease_id,
            "reason": self.reason,
            "pauser": self.pauser,
            "frees": self.frees,
            "latency_ms": round(self.latency_ms, 3),
        }


@dataclass(frozen=True, slots=True)
class GpuStatus:
    sample: GpuSample
    reading: Reading | None
    paused: bool
    healthy: bool
    problem: str = ""


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node: str
    at_s: float
    tick: int
    gpus: tuple[GpuStatus, ...]
    workloads: tuple[tuple[str, str, str], ...]
    """(lease_id, gpu_id, state) for every known workload."""


class EngineSource(Protocol):
    def views(self, gpu_id: str, now_s: float) -> Sequence[EngineView]: ...


class MpsSync(Protocol):
    def sync(self, leases: Sequence[Mapping[str, object]]) -> list[tuple[str, str, str]]:
        """Apply the ledger to MPS daemons; (kind, gpu_id, detail) per change."""
        ...


class LedgerFeed(Protocol):
    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        """The newest lease list for this node since the last call, or None when nothing new."""
        ...


Observer = Callable[[NodeSnapshot, Sequence[AgentEvent]], None]
