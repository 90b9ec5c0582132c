"""Hand-written builders for slices, pools and requests (tests read like the scenario they state)."""

from __future__ import annotations

from gpupool.core import P2, Allocator, ManualClock, Request, Resources, Slice, SliceKind
from gpupool.core.ids import seeded_lease_ids

GIB = 1024


def a_slice(
    sid: str,
    *,
    vram_gib: float = 80,
    compute: int = 1000,
    kind: SliceKind = SliceKind.WHOLE,
    node: str = "n0",
    gpu: str | None = None,
    healthy: bool = True,
) -> Slice:
    return Slice(
        id=sid,
        node=node,
        gpu_id=gpu or sid,
        kind=kind,
        capacity=Resources(int(vram_gib * GIB), compute),
        healthy=healthy,
    )


def a_request(
    rid: str,
    *,
    vram_gib: float = 1,
    vram_mib: int | None = None,
    compute: int = 0,
    priority: int = P2,
    ttl_s: float = 60,
    kinds: tuple[SliceKind, ...] = (),
    gpu_count: int = 1,
    tenant: str = "t",
    preemptible: bool | None = None,
    nodes: tuple[str, ...] = (),
) -> Request:
    return Request(
        id=rid,
        tenant=tenant,
        priority=priority,
        demand=Resources(vram_mib if vram_mib is not None else int(vram_gib * GIB), compute),
        ttl_s=ttl_s,
        kinds=frozenset(kinds),
        gpu_count=gpu_count,
        preemptible=preemptible,
        nodes=frozenset(nodes),
    )


def a_pool(*slices: Slice, policy: str = "bestfit", start_s: float = 0.0) -> tuple[Allocator, ManualClock]:
    clock = ManualClock(start_s)
    return Allocator(slices, clock=clock, policy=policy, lease_ids=seeded_lease_ids(1)), clock


def books(alloc: Allocator) -> list[tuple[str, int, int, int, bool]]:
    """A comparable picture of the ledger: (slice, granted vram, granted compute, leases, healthy)."""
    return sorted(
        (s.slice.id, s.granted.vram_mib, s.granted.compute_milli, s.num_leases, s.healthy)
        for s in alloc.states()
    )


START_WALL_S = 1_700_000_000.0
"""`HostClocks`' first wall-clock reading (Unix seconds)."""


class HostClocks:
    """A host's two clocks as plain numbers: `pass_time` moves both, `step_wall` only the wall
    clock (an NTP step, ``date -s``)."""

    def __init__(self) -> None:
        self.wall_s = START_WALL_S
        self.monotonic_s = 5_000.0

    def wall(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.monotonic_s

    def pass_time(self, seconds: float) -> None:
        self.wall_s += seconds
        self.monotonic_s += seconds

    def step_wall(self, seconds: float) -> None:
        self.wall_s += seconds
