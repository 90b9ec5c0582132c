"""Allocator edges that the scenario tests do not reach (each kills a mutant that survived them):
value types, the early-warning ratio bounds, placement validation, node constraints on multi-GPU and
preemption paths, the choice of the plan with fewest victims, and the reasons users read."""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.core import P0, P1, Allocator, LeaseState, ManualClock, OutcomeCode, Resources, SliceKind
from gpupool.core.allocator import LeaseEvent
from gpupool.core.errors import DuplicateId, InvalidInput, InvariantViolation
from gpupool.core.ids import seeded_lease_ids
from tests.builders import a_pool, a_request, a_slice


def test_lease_events_are_frozen_values() -> None:
    seen: list[LeaseEvent] = []
    alloc = Allocator([a_slice("A")], clock=ManualClock(0.0), on_event=seen.append)
    alloc.allocate(a_request("r"))
    (event,) = seen
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.kind = "x"  # type: ignore[misc]


def test_early_warning_ratio_is_in_the_half_open_unit_interval() -> None:
    Allocator([a_slice("A")], clock=ManualClock(0.0), early_warning_ratio=1.0)
    with pytest.raises(InvalidInput) as err:
        Allocator([a_slice("A")], clock=ManualClock(0.0), early_warning_ratio=0.0)
    assert err.value.field == "early_warning_ratio"


def test_marking_a_slice_unhealthy_keeps_its_leases_unless_told_to_revoke() -> None:
    alloc, _ = a_pool(a_slice("A"))
    lease = alloc.allocate(a_request("r")).lease
    assert lease is not None
    (held,) = alloc.mark_unhealthy("A")  # the leases on it, still active
    assert held.id == lease.id and held.state.value == "active"
    assert [x.id for x in alloc.leases] == [lease.id]


@pytest.mark.parametrize(("ids", "count"), [(("A", "B"), 1), (("A", "A"), 2)])
def test_place_needs_exactly_gpu_count_distinct_slices(ids: tuple[str, ...], count: int) -> None:
    alloc, _ = a_pool(a_slice("A"), a_slice("B"))
    with pytest.raises(InvalidInput) as err:
        alloc.place(a_request("r", gpu_count=count, vram_gib=80, compute=1000), ids)
    assert err.value.field == "slice_ids"


def test_place_shares_a_slice_for_single_gpu_requests() -> None:
    alloc, _ = a_pool(a_slice("A", kind=SliceKind.MPS))
    assert alloc.place(a_request("a", vram_gib=10), ("A",)).code is OutcomeCode.GRANTED
    assert alloc.place(a_request("b", vram_gib=10), ("A",)).code is OutcomeCode.GRANTED


def test_multi_gpu_requests_on_free_cards_and_under_a_node_constraint() -> None:
    alloc, _ = a_pool(*(a_slice(f"{n}/{i}", node=n) for n in ("n0", "n1") for i in range(2)))
    out = alloc.allocate(a_request("any", vram_gib=80, compute=1000, gpu_count=2))
    assert out.code is OutcomeCode.GRANTED and out.lease is not None and out.lease.node == "n0"
    alloc.release(out.lease.id)
    pinned = alloc.allocate(a_request("n1", vram_gib=80, compute=1000, gpu_count=2, nodes=("n1",)))
    assert pinned.code is OutcomeCode.GRANTED and pinned.lease is not None and pinned.lease.node == "n1"


def test_preemption_honours_the_node_constraint_past_a_disallowed_candidate() -> None:
    # A (n0) and B (n1) are both full of P2; a P0 allowed only on n1 preempts on B.
    alloc, _ = a_pool(a_slice("A", vram_gib=40, node="n0"), a_slice("B", vram_gib=40, node="n1"))
    alloc.place(a_request("a", vram_gib=40), ("A",))
    alloc.place(a_request("b", vram_gib=40), ("B",))
    out = alloc.allocate(a_request("p0", vram_gib=20, priority=P0, nodes=("n1",)))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS
    assert [v.request.id for v in out.victims] == ["b"]


def test_the_plan_with_fewest_victims_wins_over_an_earlier_candidate() -> None:
    # A (40 GiB): pinned P1 16 GiB + two P2 of 12 GiB: reclaimable 24 GiB, 2 victims for 24 GiB.
    # B (40 GiB): one P2 of 30 GiB + pinned P1 10 GiB: reclaimable 30 GiB, 1 victim.
    # A is examined first (less to reclaim); the allocator must still keep looking and take B.
    alloc, _ = a_pool(a_slice("A", vram_gib=40, gpu="gA"), a_slice("B", vram_gib=40, gpu="gB"))
    alloc.place(a_request("pin-a", vram_gib=16, priority=P1, preemptible=False), ("A",))
    alloc.place(a_request("a1", vram_gib=12), ("A",))
    alloc.place(a_request("a2", vram_gib=12), ("A",))
    alloc.place(a_request("b30", vram_gib=30), ("B",))
    alloc.place(a_request("pin-b", vram_gib=10, priority=P1, preemptible=False), ("B",))
    out = alloc.allocate(a_request("p0", vram_gib=24, priority=P0))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS
    assert [v.request.id for v in out.victims] == ["b30"]


def test_ended_leases_leave_no_preemptible_priority_behind() -> None:
    # the O(1) "nothing here may be preempted" answer relies on this count of active leases
    alloc, _ = a_pool(a_slice("A"))
    ids = [x.id for x in (alloc.allocate(a_request(f"r{i}")).lease for i in range(3)) if x is not None]
    for lid in ids:
        alloc.release(lid)
    assert dict(alloc._preemptible_priorities) == {}


def test_check_invariants_compares_the_ledger_with_the_leases() -> None:
    alloc, _ = a_pool(a_slice("A"))
    alloc.allocate(a_request("r"))
    alloc.check_invariants()
    alloc.ledger.grant("A", Resources(1024, 0), preemptible=False)  # behind the allocator's back
    with pytest.raises(InvariantViolation, match="slice A"):
        alloc.check_invariants()


def test_reasons_name_the_kinds_and_the_largest_free_slice() -> None:
    alloc, _ = a_pool(a_slice("A", vram_gib=10, kind=SliceKind.MIG))
    never = alloc.allocate(a_request("big", vram_gib=20, kinds=(SliceKind.MIG,)))
    assert never.code is OutcomeCode.UNRESOLVABLE and "of kind mig could" in never.reason
    anykind = alloc.allocate(a_request("big2", vram_gib=20))
    assert anykind.code is OutcomeCode.UNRESOLVABLE and "of kind any" in anykind.reason
    alloc.place(a_request("pin", vram_gib=6, priority=P1, preemptible=False), ("A",))
    busy = alloc.allocate(a_request("five", vram_gib=5, priority=P1, preemptible=False))
    assert busy.code is OutcomeCode.NO_CAPACITY
    assert "largest free: 4096 MiB on A" in busy.reason


def test_release_and_revoke_reasons_and_states() -> None:
    alloc, _ = a_pool(a_slice("A"))
    a = alloc.allocate(a_request("a")).lease
    b = alloc.allocate(a_request("b")).lease
    assert a is not None and b is not None
    assert alloc.release(a.id).lease.reason == "released"  # type: ignore[union-attr]
    with pytest.raises(InvalidInput) as err:
        alloc.revoke(b.id, state=LeaseState.ACTIVE, reason="x")
    assert err.value.field == "state"
    out = alloc.revoke(b.id, reason="drain")
    assert out.lease is not None and out.lease.state is LeaseState.REVOKED and out.lease.reason == "drain"


def test_a_restored_preemptible_lease_can_be_preempted_and_is_counted_once() -> None:
    first, _ = a_pool(a_slice("A", vram_gib=40))
    lease = first.allocate(a_request("batch", vram_gib=30)).lease
    assert lease is not None
    # a restart: the store hands the lease back (new lease ids must not collide with it)
    again = Allocator([a_slice("A", vram_gib=40)], clock=ManualClock(0.0), lease_ids=seeded_lease_ids(2))
    again.restore(lease)
    out = again.allocate(a_request("p0", vram_gib=20, priority=P0))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS and [v.id for v in out.victims] == [lease.id]
    assert dict(again._preemptible_priorities) == {}


def test_a_multi_gpu_lease_takes_each_card_whole() -> None:
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(2)))
    out = alloc.allocate(a_request("x2", vram_gib=10, compute=100, gpu_count=2))
    assert out.lease is not None
    assert [g.resources for g in out.lease.grants] == [Resources(80 * 1024, 1000)] * 2


def test_free_whole_cards_are_granted_without_the_preemption_path() -> None:
    # exactly two free cards on n0 and preemption off: the direct path must find them
    alloc, _ = a_pool(*(a_slice(f"{n}/{i}", node=n) for n in ("n0", "n1") for i in range(2)))
    alloc.place(a_request("busy", vram_gib=10), ("n1/0",))
    out = alloc.allocate(a_request("x2", vram_gib=80, compute=1000, gpu_count=2), preempt=False)
    assert out.code is OutcomeCode.GRANTED and out.lease is not None and out.lease.node == "n0"


def test_single_gpu_requests_honour_the_node_constraint() -> None:
    # A on n0 is the best fit (tightest); the request may only use n1
    alloc, _ = a_pool(a_slice("A", vram_gib=20, node="n0"), a_slice("B", vram_gib=80, node="n1"))
    out = alloc.allocate(a_request("r", vram_gib=10, nodes=("n1",)))
    assert out.lease is not None and out.lease.slice_ids == ("B",)


def test_preemption_keeps_looking_past_a_slice_it_cannot_clear() -> None:
    # A and B hold 40 GiB each; A's lease is P1 (a P1 request may not preempt it), B's is P2.
    alloc, _ = a_pool(a_slice("A", vram_gib=40, gpu="gA"), a_slice("B", vram_gib=40, gpu="gB"))
    alloc.place(a_request("p1", vram_gib=40, priority=P1, preemptible=True), ("A",))
    alloc.place(a_request("p2", vram_gib=40), ("B",))
    out = alloc.allocate(a_request("want", vram_gib=20, priority=P1))
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS and [v.request.id for v in out.victims] == ["p2"]


def test_unresolvable_reason_names_the_gpu_count_only_for_multi_gpu() -> None:
    alloc, _ = a_pool(a_slice("A"))
    multi = alloc.allocate(a_request("x3", vram_gib=80, compute=1000, gpu_count=3))
    assert multi.code is OutcomeCode.UNRESOLVABLE and "x 3 GPUs on one node" in multi.reason
    single = alloc.allocate(a_request("big", vram_gib=100))
    assert single.code is OutcomeCode.UNRESOLVABLE and "GPUs on one node" not in single.reason


def test_mark_unhealthy_flags_are_keyword_only() -> None:
    alloc, _ = a_pool(a_slice("A"))
    with pytest.raises(TypeError):
        alloc.mark_unhealthy("A", True)  # type: ignore[misc]


def test_place_refuses_a_multi_gpu_request_on_a_card_holding_any_lease() -> None:
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(2)))
    alloc.place(a_request("small", vram_gib=1), ("n0/0",))
    out = alloc.place(a_request("x2", vram_gib=10, gpu_count=2), ("n0/0", "n0/1"))
    assert out.code is OutcomeCode.NO_CAPACITY
    alloc.check_invariants()


def test_place_of_a_two_gpu_request_takes_both_cards_whole() -> None:
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(2)))
    out = alloc.place(a_request("x2", vram_gib=10, compute=100, gpu_count=2), ("n0/0", "n0/1"))
    assert out.lease is not None
    assert [g.resources for g in out.lease.grants] == [Resources(80 * 1024, 1000)] * 2


def test_early_warning_boundary_is_exact_in_integers() -> None:
    # 100 GiB slice: 85 % is 87,040 MiB; 86,980 MiB is below it, 87,040 reaches it
    for used_mib, warned in ((86_980, False), (87_040, True)):
        alloc, _ = a_pool(a_slice("A", vram_gib=100))
        out = alloc.allocate(a_request("r", vram_mib=used_mib))
        assert out.granted and out.early_warning is warned, used_mib


def test_a_failed_commit_leaves_the_books_unchanged() -> None:
    alloc = Allocator([a_slice("A")], clock=ManualClock(0.0), lease_ids=lambda: "same")  # type: ignore[arg-type,return-value]
    alloc.allocate(a_request("first", vram_gib=10))
    with pytest.raises(DuplicateId):
        alloc.allocate(a_request("second", vram_gib=10))
    assert alloc.ledger.state("A").granted == Resources(10 * 1024, 0)
    alloc.check_invariants()


def test_unresolvable_reason_names_two_gpus_too() -> None:
    alloc, _ = a_pool(a_slice("A"))
    out = alloc.allocate(a_request("x2", vram_gib=80, compute=1000, gpu_count=2))
    assert out.code is OutcomeCode.UNRESOLVABLE and "x 2 GPUs on one node" in out.reason


def test_lease_events_are_slotted_and_the_ratio_is_at_most_one() -> None:
    seen: list[LeaseEvent] = []
    alloc = Allocator([a_slice("A")], clock=ManualClock(0.0), on_event=seen.append)
    alloc.allocate(a_request("r"))
    assert not hasattr(seen[0], "__dict__")
    with pytest.raises(InvalidInput):
        Allocator([a_slice("A")], clock=ManualClock(0.0), early_warning_ratio=1.5)
    with pytest.raises(TypeError):
        alloc.allocate(a_request("s"), False)  # type: ignore[misc]


def test_the_node_constraint_skips_a_tighter_slice_of_the_same_shape() -> None:
    # A (n0) and B (n1) have the same shape; A is tighter (70 GiB used), so best fit looks at it first
    alloc, _ = a_pool(a_slice("A", node="n0"), a_slice("B", node="n1"))
    alloc.place(a_request("fill", vram_gib=70), ("A",))
    out = alloc.allocate(a_request("r", vram_gib=5, nodes=("n1",)))
    assert out.lease is not None and out.lease.slice_ids == ("B",)


def test_the_lowest_priority_single_victim_wins() -> None:
    # A: one preemptible P1 lease; B: one P2 lease; both free 40 GiB if cleared. A is looked at
    # first; B's plan evicts a lower priority, so it is the one taken.
    alloc, _ = a_pool(a_slice("A", vram_gib=40, gpu="gA"), a_slice("B", vram_gib=40, gpu="gB"))
    alloc.place(a_request("p1", vram_gib=30, priority=P1, preemptible=True), ("A",))
    alloc.place(a_request("p2", vram_gib=35), ("B",))
    out = alloc.allocate(a_request("p0", vram_gib=30, priority=P0))
    assert [v.request.id for v in out.victims] == ["p2"]


def test_unhealthy_cards_make_a_multi_gpu_request_unresolvable() -> None:
    alloc, _ = a_pool(*(a_slice(f"n0/{i}") for i in range(2)))
    alloc.mark_unhealthy("n0/0")
    out = alloc.allocate(a_request("x2", vram_gib=80, compute=1000, gpu_count=2))
    assert out.code is OutcomeCode.UNRESOLVABLE


def test_multi_gpu_node_constraint_on_the_direct_and_preemption_paths() -> None:
    alloc, _ = a_pool(*(a_slice(f"{n}/{i}", node=n) for n in ("n0", "n1") for i in range(2)))
    direct = alloc.allocate(
        a_request("x2", vram_gib=80, compute=1000, gpu_count=2, nodes=("n1",)), preempt=False
    )
    assert direct.code is OutcomeCode.GRANTED and direct.lease is not None and direct.lease.node == "n1"
    alloc.release(direct.lease.id)
    for sid in ("n0/0", "n0/1", "n1/0", "n1/1"):
        alloc.place(a_request(f"b-{sid}", vram_gib=10), (sid,))
    out = alloc.allocate(
        a_request("p0x2", vram_gib=80, compute=1000, priority=P0, gpu_count=2, nodes=("n1",))
    )
    assert out.code is OutcomeCode.PREEMPTED_VICTIMS and out.lease is not None and out.lease.node == "n1"
    assert sorted(v.request.id for v in out.victims) == ["b-n1/0", "b-n1/1"]


def test_revocation_on_an_unhealthy_slice_says_why_and_release_reason_is_keyword_only() -> None:
    alloc, _ = a_pool(a_slice("A"))
    lease = alloc.allocate(a_request("r")).lease
    assert lease is not None
    (ended,) = alloc.mark_unhealthy("A", revoke=True)
    assert ended.state is LeaseState.REVOKED and ended.reason == "slice A unhealthy"
    with pytest.raises(TypeError):
        alloc.release(lease.id, "x")  # type: ignore[misc]
