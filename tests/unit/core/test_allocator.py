"""Allocator behaviour, worked by hand on tiny pools."""

from __future__ import annotations

import pytest

from gpupool.core import P0, P1, InvalidInput, LeaseState, OutcomeCode, SliceKind, UnknownId
from tests.builders import GIB, a_pool, a_request, a_slice, books


def test_best_fit_uses_both_dimensions() -> None:
    # Two 40 GiB slices. A has 10 GiB free but almost no compute left; B has 12 GiB and lots of compute.
    # A request for 8 GiB x 300 mGPU cannot go on A (compute), must go to B.
    alloc, _ = a_pool(a_slice("A", vram_gib=40, gpu="gA"), a_slice("B", vram_gib=40, gpu="gB"))
    assert alloc.allocate(a_request("fillA", vram_gib=30, compute=900)).granted
    assert alloc.allocate(a_request("fillB", vram_gib=28, compute=100)).granted
    out = alloc.allocate(a_request("r", vram_gib=8, compute=300))
    assert out.code is OutcomeCode.GRANTED
    assert out.lease is not None and out.lease.slice_ids == ("B",)


def test_two_dimensional_best_fit_beats_vram_only() -> None:
    # Slice A: 20 GiB free, 100 mGPU free. Slice B: 24 GiB free, 800 mGPU free.
    # Request 16 GiB x 100 mGPU. VRAM-only best fit picks A (4 GiB left), and so does 2-D:
    # A leaves 4/80*1000=51 + 0 = 51; B leaves 8/80*1000=102 + 700 = 802.
    # Request 16 GiB x 50: seed-bestfit still A. Now make A leave more compute than B:
    pool = [a_slice("A", gpu="gA"), a_slice("B", gpu="gB")]
    for policy, want in (("bestfit", "B"), ("seed-bestfit", "A")):
        alloc, _ = a_pool(*pool, policy=policy)
        alloc.allocate(a_request("a", vram_gib=60, compute=0, kinds=(SliceKind.WHOLE,)))  # on A (tie -> id)
        alloc.allocate(a_request("b", vram_gib=56, compute=900))  # A has 20 GiB free; B takes it
        # A: 20 GiB x 1000 free; B: 24 GiB x 100 free. Request 16 GiB x 100:
        #   bestfit: A = 4/80 -> 51 + 900 = 951; B = 8/80 -> 102 + 0 = 102 -> B.
        #   seed-bestfit (VRAM only): A leaves 4 GiB, B leaves 8 GiB -> A.
        out = alloc.allocate(a_request("r", vram_gib=16, compute=100))
        assert out.lease is not None and out.lease.slice_ids == (want,), policy


def test_request_never_spans_gpus_and_unresolvable_when_too_big() -> None:
    alloc, _ = a_pool(a_slice("A", vram_gib=40, gpu="gA"), a_slice("B", vram_gib=40, gpu="gB"))
    out = alloc.allocate(a_request("big", vram_gib=60))  # 80 GiB in total, but no single slice has 60
    assert out.code is OutcomeCode.UNRESOLVABLE
    assert "could ever hold" in out.reason


def test_no_capacity_when_full_and_nothing_preemptible() -> None:
    alloc, _ = a_pool(a_slice("A", vram_gib=40))
    assert alloc.allocate(a_request("p1", vram_gib=30, priority=P1)).granted
    out = alloc.allocate(a_request("p0", vram_gib=20, priority=P0))
    assert out.code is OutcomeCode.NO_CAPACITY
    assert alloc.leases.active(out.lease.id if out.lease else "") is None


def test_multi_gpu_request_takes_whole_cards_on_one_node() -> None:
    # n0 has 2 free cards, n1 has 4: a 3-GPU request must land on n1; a 2-GPU request best-fits n0.
    slices = [a_slice(f"n0/{i}", node="n0") for i in range(2)] + [
        a_slice(f"n1/{i}", node="n1") for i in range(4)
    ]
    alloc, _ = a_pool(*slices)
    three = alloc.allocate(a_request("three", vram_gib=80, compute=1000, gpu_count=3))
    assert three.lease is not None and three.lease.node == "n1" and len(three.lease.grants) == 3
    two = alloc.allocate(a_request("two", vram_gib=80, compute=1000, gpu_count=2))
    assert two.lease is not None and two.lease.node == "n0"
    assert alloc.allocate(a_request("x", vram_gib=80, gpu_count=2)).code is OutcomeCode.NO_CAPACITY
    assert alloc.allocate(a_request("y", vram_gib=80, gpu_count=5)).code is OutcomeCode.UNRESOLVABLE
    alloc.check_invariants()


def test_expiry_reclaims_exactly_what_was_granted() -> None:
    alloc, clock = a_pool(a_slice("A", vram_gib=40))
    lease = alloc.allocate(a_request("r", vram_gib=10, compute=100, ttl_s=5)).lease
    assert lease is not None
    clock.advance(4.9)
    assert alloc.expire_due() == ()
    assert alloc.renew(lease.id, 5).code is OutcomeCode.RENEWED  # now expires at 9.9
    clock.advance(4.95)  # 9.85: still valid
    assert alloc.expire_due() == ()
    clock.advance(0.05)  # 9.9: a lease is expired from its expires_at instant on
    (expired,) = alloc.expire_due()
    assert expired.id == lease.id and expired.state is LeaseState.EXPIRED
    assert books(alloc) == [("A", 0, 0, 0, True)]
    assert alloc.renew(lease.id).code is OutcomeCode.ALREADY_ENDED


def test_release_is_idempotent_and_unknown_id_is_an_error() -> None:
    alloc, _ = a_pool(a_slice("A"))
    lease = alloc.allocate(a_request("r")).lease
    assert lease is not None
    assert alloc.release(lease.id).code is OutcomeCode.RELEASED
    assert alloc.release(lease.id).code is OutcomeCode.ALREADY_ENDED
    with pytest.raises(UnknownId, match='unknown lease "nope"'):
        alloc.release("nope")


def test_unhealthy_slice_gets_no_leases_and_reports_its_leases() -> None:
    alloc, _ = a_pool(a_slice("A", gpu="gA"), a_slice("B", gpu="gB"))
    on_a = alloc.allocate(a_request("r1", vram_gib=70)).lease
    assert on_a is not None and on_a.slice_ids == ("A",)
    reported = alloc.mark_unhealthy("A")
    assert [x.id for x in reported] == [on_a.id]
    out = alloc.allocate(a_request("r2", vram_gib=5))
    assert out.lease is not None and out.lease.slice_ids == ("B",)
    revoked = alloc.mark_unhealthy("B", revoke=True)
    assert [x.state for x in revoked] == [LeaseState.REVOKED]
    assert alloc.allocate(a_request("r3", vram_gib=5)).code is OutcomeCode.UNRESOLVABLE
    alloc.mark_healthy("B")
    assert alloc.allocate(a_request("r4", vram_gib=5)).granted
    alloc.check_invariants()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"vram_mib": 0}, "demand.vram_mib"),
        ({"vram_mib": -5}, "demand.vram_mib"),
        ({"vram_mib": 10**12}, "demand.vram_mib"),
        ({"compute": -1}, "demand.compute_milli"),
        ({"compute": 1001}, "demand.compute_milli"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"ttl_s": -1}, "ttl_s"),
        ({"ttl_s": float("nan")}, "ttl_s"),
        ({"ttl_s": float("inf")}, "ttl_s"),
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu_count": 65}, "gpu_count"),
        ({"tenant": ""}, "tenant"),
        ({"gpu_count": 2, "kinds": (SliceKind.MIG,)}, "kinds"),
    ],
)
def test_bad_input_names_the_field_and_leaves_the_ledger_unchanged(
    changes: dict[str, object], field: str
) -> None:
    alloc, _ = a_pool(a_slice("A"), a_slice("B", node="n0"))
    alloc.allocate(a_request("keep", vram_gib=3, compute=10))
    before = books(alloc)
    with pytest.raises(InvalidInput) as err:
        alloc.allocate(a_request("bad", **changes))  # type: ignore[arg-type]
    assert err.value.field == field
    assert field in str(err.value)
    assert books(alloc) == before
    alloc.check_invariants()


def test_duplicate_slice_id_is_rejected() -> None:
    alloc, _ = a_pool(a_slice("A"))
    before = books(alloc)
    with pytest.raises(InvalidInput, match=r"slice\.id"):
        alloc.add_slice(a_slice("A"))
    assert books(alloc) == before


def test_renew_with_bad_ttl_leaves_lease_unchanged() -> None:
    alloc, _ = a_pool(a_slice("A"))
    lease = alloc.allocate(a_request("r", ttl_s=10)).lease
    assert lease is not None
    with pytest.raises(InvalidInput, match="ttl_s"):
        alloc.renew(lease.id, -3)
    assert alloc.get(lease.id) == lease


def test_place_checks_explicit_slices() -> None:
    alloc, _ = a_pool(a_slice("A", vram_gib=10, gpu="gA"), a_slice("B", vram_gib=10, gpu="gB", node="n1"))
    assert alloc.place(a_request("r", vram_gib=8), ("A",)).granted
    assert alloc.place(a_request("r2", vram_gib=8), ("A",)).code is OutcomeCode.NO_CAPACITY
    assert alloc.place(a_request("r3", vram_gib=12), ("B",)).code is OutcomeCode.UNRESOLVABLE
    with pytest.raises(InvalidInput, match="one node"):
        alloc.place(a_request("r4", vram_gib=1, gpu_count=2), ("A", "B"))
    with pytest.raises(UnknownId):
        alloc.place(a_request("r5", vram_gib=1), ("Z",))


def test_early_warning_at_85_percent_of_the_slice() -> None:
    alloc, _ = a_pool(a_slice("A", vram_gib=100))
    assert not alloc.allocate(a_request("r1", vram_mib=84 * GIB)).early_warning  # 84 %
    assert alloc.allocate(a_request("r2", vram_mib=1 * GIB)).early_warning  # 85 %


def test_events_are_delivered_in_order() -> None:
    from gpupool.core import Allocator, ManualClock
    from gpupool.core.allocator import LeaseEvent

    seen: list[LeaseEvent] = []
    clock = ManualClock()
    alloc = Allocator([a_slice("A")], clock=clock, on_event=seen.append)
    lease = alloc.allocate(a_request("r", ttl_s=1)).lease
    assert lease is not None
    alloc.renew(lease.id, 2)
    clock.advance(3)
    alloc.expire_due()
    assert [e.kind for e in seen] == ["granted", "renewed", "expired"]
    assert [e.lease.revision for e in seen] == [1, 2, 3]


def test_spread_policy_picks_the_emptiest_slice() -> None:
    alloc, _ = a_pool(a_slice("A", gpu="gA"), a_slice("B", gpu="gB"), policy="spread")
    first = alloc.allocate(a_request("r1", vram_gib=10)).lease
    second = alloc.allocate(a_request("r2", vram_gib=10)).lease
    assert first is not None and second is not None
    assert {first.slice_ids[0], second.slice_ids[0]} == {"A", "B"}


def test_restore_rebuilds_the_books() -> None:
    alloc, _ = a_pool(a_slice("A", gpu="gA"), a_slice("B", gpu="gB"))
    leases = [alloc.allocate(a_request(f"r{i}", vram_gib=7, compute=100)).lease for i in range(5)]
    want = books(alloc)
    fresh, _ = a_pool(a_slice("A", gpu="gA"), a_slice("B", gpu="gB"))
    for lease in leases:
        assert lease is not None
        fresh.restore(lease)
    assert books(fresh) == want
    fresh.check_invariants()
    with pytest.raises(InvalidInput):
        fresh.restore(leases[0])  # type: ignore[arg-type]
    assert books(fresh) == want
