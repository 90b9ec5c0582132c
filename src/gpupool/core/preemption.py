"""Preemption planner: the smallest set of lower-priority victims that makes a request fit on ONE
slice (or, for N-GPU requests, on N whole cards of ONE node). Pure: it reads states, returns a plan.

Victim rules:
- only leases whose request is preemptible AND whose priority is strictly lower than the request's;
- victim order (total): 1. lowest priority first; 2. youngest first (latest ``granted_at``), except
  retained session prefixes (first label `RETAINED_LABEL`, `gpupool.core.sessions`): least recently
  used first (earliest ``granted_at``: such a lease is granted when its session's turn ends);
  3. lease id ascending;
- take victims in that order until the request fits, then drop any earlier-chosen victim that is not
  needed after all (latest-chosen first), so no lease is evicted for nothing.

Plans compare by `PreemptionPlan.cost_key`: fewer victims, then lower highest victim priority, then
less victim VRAM, then slice ids. The allocator commits a plan inside a ledger transaction and only
if the request then fits; the seed evicted P2 leases anywhere in the pool and retried recursively.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpupool.core.ledger import SliceState
from gpupool.core.model import Lease, Request
from gpupool.hardware.units import Resources


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    node: str
    slice_ids: tuple[str, ...]
    victims: tuple[Lease, ...]

    def cost_key(self) -> tuple[int, int, int, tuple[str, ...]]:
        top = max((v.priority for v in self.victims), default=-(2**62))
        vram = sum(v.total.vram_mib for v in self.victims)
        return (len(self.victims), top, vram, self.slice_ids)


RETAINED_LABEL = "gpupool.io/retained-session"
"""First label of a retained session prefix (a preemptible KV lease; `gpupool.core.sessions`)."""


def victim_order(lease: Lease) -> tuple[int, float, str]:
    labels = lease.request.labels
    lru = bool(labels) and labels[0][0] == RETAINED_LABEL
    return (lease.priority, lease.granted_at if lru else -lease.granted_at, lease.id)


def can_preempt(victim: Lease, request: Request) -> bool:
    return victim.request.is_preemptible and victim.priority < request.priority


def _grant_on(lease: Lease, slice_id: str) -> Resources:
    for g in lease.grants:
        if g.slice_id == slice_id:
            return g.resources
    return Resources(0, 0)


def plan_slice(state: SliceState, leases: Sequence[Lease], request: Request) -> PreemptionPlan | None:
    """Victims on ``state.slice`` that make ``request.demand`` fit, or None if no set can."""
    need = request.demand
    sid = state.slice.id
    if not need.fits_in(state.slice.capacity):
        return None
    free = state.free
    chosen: list[tuple[Lease, Resources]] = []
    for lease in sorted((v for v in leases if can_preempt(v, request)), key=victim_order):
        res = _grant_on(lease, sid)
        chosen.append((lease, res))
        free = free + res
        if need.fits_in(free):
            break
    else:
        return None
    if not chosen:
        return None
    for item in reversed(chosen[:-1]):
        smaller = free - item[1]
        if need.fits_in(smaller):
            chosen.remove(item)
            free = smaller
    return PreemptionPlan(node=state.slice.node, slice_ids=(sid,), victims=tuple(v for v, _ in chosen))


def plan_whole_node(
    node: str,
    cards: Iterable[tuple[SliceState, Sequence[Lease]]],
    request: Request,
) -> PreemptionPlan | None:
    """N whole cards on ``node``: each must end up with nothing granted. Cheapest cards first."""
    options: list[tuple[int, int, str, tuple[Lease, ...]]] = []
    for state, leases in cards:
        if not state.healthy or not request.demand.fits_in(state.slice.capacity):
            continue
        if not all(can_preempt(v, request) for v in leases):
            continue
        top = max((v.priority for v in leases), default=-(2**62))
        options.append((len(leases), top, state.slice.id, tuple(sorted(leases, key=victim_order))))
    if len(options) < request.gpu_count:
        return None
    options.sort()
    picked = options[: request.gpu_count]
    victims: dict[str, Lease] = {}
    for _, _, _, vs in picked:
        for v in vs:
            victims.setdefault(v.id, v)
    return PreemptionPlan(
        node=node,
        slice_ids=tuple(sorted(p[2] for p in picked)),
        victims=tuple(sorted(victims.values(), key=victim_order)),
    )
