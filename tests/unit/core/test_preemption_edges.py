"""Preemption planner edges that the scenario tests do not reach (each kills a mutant that survived).

- a plan is an immutable value (frozen, slotted): the allocator keeps plans while comparing them;
- a lease that holds nothing on the slice being planned frees nothing there;
- whole-card preemption keeps looking past a card it cannot clear (a pinned lease on the first card
  of a node does not hide the node's other cards).
"""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.core import P0, P1, OutcomeCode
from gpupool.core.preemption import PreemptionPlan, plan_slice
from tests.builders import a_pool, a_request, a_slice


def test_a_plan_is_frozen_and_slotted() -> None:
    plan = PreemptionPlan(node="n0", slice_ids=("A",), victims=())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.node = "n1"  # type: ignore[misc]
    assert not hasattr(plan, "__dict__")


def test_a_lease_on_another_slice_frees_nothing_here() -> None:
    # A (10 GiB) holds a pinned 10 GiB - 1 MiB lease: 1 MiB free. B holds a preemptible P2 lease.
    # P0 wants 2 MiB on A: only B's lease can be preempted, and it holds nothing on A, so no plan.
    alloc, _ = a_pool(a_slice("A", vram_gib=10, gpu="gA"), a_slice("B", vram_gib=10, gpu="gB"))
    alloc.place(a_request("pinned", vram_mib=10 * 1024 - 1, priority=P1, preemptible=False), ("A",))
    alloc.place(a_request("other", vram_gib=5), ("B",))
    assert alloc.ledger.state("A").free.vram_mib == 1
    elsewhere = list(alloc.leases.on_slice("B"))
    assert plan_slice(alloc.ledger.state("A"), elsewhere, a_request("p0", vram_mib=2, priority=P0)) is None
    # the same request with compute: nothing on A frees compute either
    full = a_request("p0c", vram_mib=1, compute=1, priority=P0)
    alloc2, _ = a_pool(a_slice("A", vram_gib=10, gpu="gA"), a_slice("B", vram_gib=10, gpu="gB"))
    alloc2.place(a_request("pinned", vram_gib=1, compute=1000, priority=P1, preemptible=False), ("A",))
    alloc2.place(a_request("other", vram_gib=5, compute=500), ("B",))
    assert plan_slice(alloc2.ledger.state("A"), list(alloc2.leases.on_slice("B")), full) is None


def test_whole_card_preemption_looks_past_a_card_it_cannot_clear() -> None:
    # n0 has three cards; the first holds a pinned P1 lease, the other two preemptible P2 leases.
    # A P0 for two whole cards must take n0/1 and n0/2.
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(3)))
    alloc.place(a_request("pinned", vram_gib=10, priority=P1, preemptible=False), ("n0/0",))
    alloc.place(a_request("b1", vram_gib=10), ("n0/1",))
    alloc.place(a_request("b2", vram_gib=10), ("n0/2",))
    out = alloc.allocate(a_request("p0x2", vram_gib=80, compute=1000, priority=P0, gpu_count=2))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS
    assert out.lease is not None and out.lease.slice_ids == ("n0/1", "n0/2")
    assert sorted(v.request.id for v in out.victims) == ["b1", "b2"]
    alloc.check_invariants()
