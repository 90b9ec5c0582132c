"""Preemption planner edges that the scenario tests do not reach (each kills a mutant that survived).

- a plan is an immutable value (frozen, slotted): the allocator keeps plans while comparing them;
- a lease that holds nothing on the slice being planned frees nothing there;
- whole-card preemption keeps looking past a card it cannot clear (a pinned lease on the first card
  of a node does not hide the node's other cards), and never targets an unhealthy card;
- among equal priorities the youngest lease is the victim, and pruning reconsiders every earlier
  pick, so no lease is evicted for nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.core import P0, P1, OutcomeCode
from gpupool.core.preemption import PreemptionPlan, plan_slice, plan_whole_node
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


def test_equal_priority_victims_go_youngest_first() -> None:
    # One 40 GiB slice: "old" then "young" (10 GiB each, P2), 20 GiB free. P0 wants 30 GiB: one
    # victim is enough, and it must be the youngest (latest granted_at), not the oldest.
    alloc, clock = a_pool(a_slice("A", vram_gib=40))
    alloc.allocate(a_request("old", vram_gib=10))
    clock.advance(1)
    alloc.allocate(a_request("young", vram_gib=10))
    out = alloc.allocate(a_request("p0", vram_gib=30, priority=P0))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS
    assert [v.request.id for v in out.victims] == ["young"]


def test_pruning_considers_every_earlier_victim() -> None:
    # One 40 GiB slice holding, in grant order, y3 (20 GiB), y2 (10 GiB), y1 (5 GiB); 5 GiB free.
    # P0 wants 25 GiB: youngest first it takes y1 (10 free), y2 (20), y3 (40). Pruning then drops
    # y2 (30 left >= 25) and y1 (25 left >= 25): one victim, y3. Every earlier pick is reconsidered.
    alloc, clock = a_pool(a_slice("A", vram_gib=40))
    for rid, gib in (("y3", 20), ("y2", 10), ("y1", 5)):
        alloc.allocate(a_request(rid, vram_gib=gib))
        clock.advance(1)
    out = alloc.allocate(a_request("p0", vram_gib=25, priority=P0))
    assert [v.request.id for v in out.victims] == ["y3"]
    assert sorted(x.request.id for x in alloc.leases) == ["p0", "y1", "y2"]


def test_whole_card_preemption_skips_unhealthy_cards() -> None:
    # n0 has two cards holding preemptible P2 leases; n0/0 turns unhealthy. A P0 for two whole cards
    # cannot be placed on n0: an unhealthy card is never a target, even if clearing it would fit.
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(2)))
    alloc.place(a_request("b0", vram_gib=10), ("n0/0",))
    alloc.place(a_request("b1", vram_gib=10), ("n0/1",))
    alloc.mark_unhealthy("n0/0")
    states = [(alloc.ledger.state(s), alloc.leases.on_slice(s)) for s in ("n0/0", "n0/1")]
    p0 = a_request("p0x2", vram_gib=80, compute=1000, priority=P0, gpu_count=2)
    assert plan_whole_node("n0", states, p0) is None
    assert alloc.allocate(p0).code is not OutcomeCode.PREEMPTED_VICTIMS
    assert sorted(x.request.id for x in alloc.leases) == ["b0", "b1"]


def test_pruning_keeps_the_victims_that_are_needed() -> None:
    # One 40 GiB slice holding a, b, c (10 GiB each, in grant order); 10 GiB free. P0 wants 35 GiB:
    # all three must go (dropping any leaves 30 < 35), so pruning keeps every one of them.
    alloc, clock = a_pool(a_slice("A", vram_gib=40))
    for rid in ("a", "b", "c"):
        alloc.allocate(a_request(rid, vram_gib=10))
        clock.advance(1)
    out = alloc.allocate(a_request("p0", vram_gib=35, priority=P0))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS
    assert sorted(v.request.id for v in out.victims) == ["a", "b", "c"]


def test_a_foreign_lease_in_the_candidates_changes_nothing() -> None:
    # plan_slice is pure over what it is given: a lease without a grant on the slice frees nothing
    # and costs nothing. A (20 GiB) holds x (10 GiB); y on B is younger, so it is looked at first.
    alloc, clock = a_pool(a_slice("A", vram_gib=20, gpu="gA"), a_slice("B", vram_gib=20, gpu="gB"))
    alloc.place(a_request("x", vram_gib=10, compute=500), ("A",))
    clock.advance(1)
    alloc.place(a_request("y", vram_gib=5, compute=100), ("B",))
    candidates = [*alloc.leases.on_slice("A"), *alloc.leases.on_slice("B")]
    whole = a_request("p0", vram_gib=20, compute=1000, priority=P0)  # exactly A's capacity
    plan = plan_slice(alloc.ledger.state("A"), candidates, whole)
    assert plan is not None and [v.request.id for v in plan.victims] == ["x"]


def test_whole_card_preemption_looks_past_an_unhealthy_first_card() -> None:
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(3)))
    for i in range(3):
        alloc.place(a_request(f"b{i}", vram_gib=10), (f"n0/{i}",))
    alloc.mark_unhealthy("n0/0")
    states = [(alloc.ledger.state(f"n0/{i}"), alloc.leases.on_slice(f"n0/{i}")) for i in range(3)]
    plan = plan_whole_node(
        "n0", states, a_request("p0x2", vram_gib=80, compute=1000, priority=P0, gpu_count=2)
    )
    assert plan is not None and plan.slice_ids == ("n0/1", "n0/2")
