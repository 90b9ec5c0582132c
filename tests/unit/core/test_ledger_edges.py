"""`SliceLedger` edges that the allocator scenarios do not reach (each kills a mutant that survived
them): removal of busy or whole slices, the healthy count of a group, capacity and preemptible bounds
of grant / ungrant, the free-whole-card index, and `check` itself catching corrupted books."""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.core.errors import InvalidInput, InvariantViolation
from gpupool.core.ledger import LedgerTransaction, SliceLedger
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import Resources
from tests.builders import a_slice


def ledger(*kinds: SliceKind) -> SliceLedger:
    led = SliceLedger()
    for i, kind in enumerate(kinds):
        led.add(a_slice(f"s{i}", vram_gib=10, kind=kind, gpu=f"g{i}"))
    return led


def test_a_slice_holding_a_lease_cannot_be_removed_even_a_zero_sized_one() -> None:
    led = ledger(SliceKind.MPS)
    led.grant("s0", Resources(0, 0), preemptible=False)
    with pytest.raises(InvalidInput) as err:
        led.remove("s0")
    assert err.value.field == "slice_id"
    led.ungrant("s0", Resources(0, 0), preemptible=False)
    assert led.remove("s0").id == "s0"


def test_removing_a_healthy_slice_counts_one_less_in_its_group() -> None:
    led = ledger(SliceKind.MPS, SliceKind.MPS, SliceKind.MPS)
    led.remove("s0")
    (group,) = led.groups()
    assert group.num_healthy == 2
    led.check()


def test_removing_whole_and_partial_slices_keeps_the_whole_card_index() -> None:
    led = ledger(SliceKind.WHOLE, SliceKind.WHOLE, SliceKind.MIG)
    assert led.whole_nodes() == {"n0": ["s0", "s1"]}
    assert led.free_whole("n0") == {"s0", "s1"}  # partial slices are never whole cards
    led.remove("s2")
    led.remove("s0")
    assert led.whole_nodes() == {"n0": ["s1"]}
    assert led.free_whole("n0") == {"s1"}
    led.check()


def test_a_grant_beyond_capacity_is_refused() -> None:
    led = ledger(SliceKind.MPS)
    with pytest.raises(InvariantViolation):
        led.grant("s0", Resources(10 * 1024 + 1, 0), preemptible=False)
    with pytest.raises(InvariantViolation):
        led.grant("s0", Resources(0, 1001), preemptible=False)
    assert led.state("s0").granted == Resources(0, 0)


@pytest.mark.parametrize("res", [Resources(1024, 0), Resources(0, 100)])
def test_an_ungrant_may_not_take_more_preemptible_than_was_granted(res: Resources) -> None:
    # 1 MiB / 1 mGPU less is preemptible than the ungrant claims: its preemptible count would be -1
    led = ledger(SliceKind.MPS)
    led.grant("s0", Resources(max(0, res.vram_mib - 1), max(0, res.compute_milli - 1)), preemptible=True)
    led.grant("s0", Resources(min(1, res.vram_mib), min(1, res.compute_milli)), preemptible=False)
    with pytest.raises(InvariantViolation):
        led.ungrant("s0", res, preemptible=True)


def test_preemptible_is_keyword_only() -> None:
    led = ledger(SliceKind.MPS)
    with pytest.raises(TypeError):
        led.grant("s0", Resources(1, 0), True)  # type: ignore[misc]
    led.grant("s0", Resources(1, 0), preemptible=True)
    with pytest.raises(TypeError):
        led.ungrant("s0", Resources(1, 0), True)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [("granted_compute", -1), ("granted_vram", 11 * 1024), ("pre_compute", -1), ("pre_vram", 1)],
)
def test_check_catches_corrupted_books(field: str, value: int) -> None:
    led = ledger(SliceKind.MPS)
    led.check()
    setattr(led._entries["s0"], field, value)  # behind the ledger's back
    with pytest.raises(InvariantViolation):
        led.check()


def test_check_catches_a_stale_free_index() -> None:
    led = ledger(SliceKind.MPS)
    led._entries["s0"].granted_vram = 1024  # books changed, free index not: it is stale
    led._entries["s0"].num_leases = 1
    with pytest.raises(InvariantViolation):
        led.check()


def test_value_types_are_slotted_and_groups_report_their_shape() -> None:
    led = ledger(SliceKind.MPS)
    (group,) = led.groups()
    assert group.capacity == Resources(10 * 1024, 1000)
    assert not hasattr(group, "__dict__") and not hasattr(led.state("s0"), "__dict__")


def test_free_is_capacity_minus_granted() -> None:
    led = ledger(SliceKind.MPS)
    led.grant("s0", Resources(1024, 300), preemptible=False)
    assert led.free("s0") == Resources(9 * 1024, 700)


@pytest.mark.parametrize(
    ("granted", "taken"),
    [(Resources(1023, 100), Resources(1024, 100)), (Resources(1024, 99), Resources(1024, 100))],
)
def test_an_ungrant_may_not_go_below_zero_in_either_dimension(granted: Resources, taken: Resources) -> None:
    led = ledger(SliceKind.MPS)
    led.grant("s0", granted, preemptible=False)
    with pytest.raises(InvariantViolation):
        led.ungrant("s0", taken, preemptible=False)


def test_an_ungrant_needs_a_lease_to_end() -> None:
    led = ledger(SliceKind.MPS)
    with pytest.raises(InvariantViolation):
        led.ungrant("s0", Resources(0, 0), preemptible=False)


def test_check_catches_a_stale_index_on_a_full_slice() -> None:
    led = ledger(SliceKind.MPS)
    led.grant("s0", Resources(10 * 1024, 1000), preemptible=False)  # nothing free: key (0, 0, s0)
    led._entries["s0"].granted_vram = 9 * 1024  # books changed, free index not
    with pytest.raises(InvariantViolation):
        led.check()


def test_group_info_is_frozen_and_health_round_trips_its_count() -> None:
    led = ledger(SliceKind.MPS, SliceKind.MPS)
    (group,) = led.groups()
    with pytest.raises(dataclasses.FrozenInstanceError):
        group.num_healthy = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        led.state("s0").num_leases = 1  # type: ignore[misc]
    led.set_healthy("s0", False)
    assert led.groups()[0].num_healthy == 1
    led.set_healthy("s0", True)
    assert led.groups()[0].num_healthy == 2
    led.check()


def test_transaction_flags_are_keyword_only_too() -> None:
    led = ledger(SliceKind.MPS)
    tx = LedgerTransaction(led)
    with pytest.raises(TypeError):
        tx.grant("s0", Resources(1, 0), False)  # type: ignore[misc]
    tx.grant("s0", Resources(1, 0), preemptible=False)
    with pytest.raises(TypeError):
        tx.ungrant("s0", Resources(1, 0), False)  # type: ignore[misc]
    tx.rollback()
    assert led.state("s0").granted == Resources(0, 0)
