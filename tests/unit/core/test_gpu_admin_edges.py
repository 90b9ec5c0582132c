"""Edge cases of the controller's per-GPU half (`GpuAdmin`), through `LeaseController` with the
in-memory store: bad readings are refused naming the field and leave the pool as it was; pause
events name exactly the sheddable leases on that GPU (placement and request leases); a RESUME, an
undrain, a slice marked healthy and a GPU back to ``ok`` each let queued work in at once; health
and drain combine (a drained GPU stays closed while healthy, a failed one stays closed while
undrained); revocations carry their reason and are durable; new thresholds apply from the next
reading. Written against the survivors of a mutation run of ``core/gpu_admin.py``."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import pytest

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, LeaseState, ManualClock, OutcomeCode, UnknownId
from gpupool.core.controller import Backend, ControllerConfig, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.ports import GatewayEvent
from gpupool.core.watermarks import Reading, WatermarkConfig
from gpupool.hardware.slices import Slice
from tests.builders import GIB, a_request, a_slice


def make(*slices: Slice) -> tuple[LeaseController, ManualClock, MemoryLeaseStore, list[GatewayEvent]]:
    clock = ManualClock(1000.0)
    store = MemoryLeaseStore()
    events: list[GatewayEvent] = []
    c = LeaseController(
        slices or (a_slice("g0", gpu="g0", vram_gib=40), a_slice("g1", gpu="g1", vram_gib=40)),
        clock=clock,
        store=store,
        sink=events.append,
        config=ControllerConfig(),
        lease_ids=seeded_lease_ids(3),
        ticket_ids=seeded_lease_ids(4),
    )
    return c, clock, store, events


def reading(gpu: str, used_gib: float, clock: ManualClock, total_gib: float = 40) -> Reading:
    return Reading(gpu, int(used_gib * GIB), int(total_gib * GIB), at_s=clock.now())


def healthy(c: LeaseController, sid: str) -> bool:
    return c.allocator.slice_state(sid).healthy


def test_a_reading_for_an_unknown_gpu_is_refused_naming_it_and_changes_nothing() -> None:
    c, clock, _, events = make()
    with pytest.raises(InvalidInput) as err:
        c.feed_reading(reading("g9", 39, clock))
    assert (err.value.field, err.value.value) == ("gpu_id", "g9")
    assert c.readings == {} and c.paused_gpus() == set() and events == []


def test_a_reading_with_a_bad_health_is_refused_naming_it_and_changes_nothing() -> None:
    c, clock, _, events = make()
    lease = c.acquire(a_request("x", priority=P2), gpu_id="g0").lease
    assert lease is not None
    events.clear()
    with pytest.raises(InvalidInput) as err:
        c.feed_reading(reading("g0", 39, clock), health="broken")
    assert (err.value.field, err.value.value) == ("health", "broken")
    assert c.readings == {} and c.gpu_health == {} and c.paused_gpus() == set() and events == []
    assert healthy(c, "g0") and c.get(lease.id).state is LeaseState.ACTIVE
    for ok in ("ok", "degraded", "failed"):  # the three accepted values
        c.feed_reading(reading("g1", 1, clock), health=ok)
        assert c.gpu_health.get("g1", "ok") == ok


def test_a_pause_names_exactly_the_sheddable_leases_on_that_gpu_sorted_with_their_tenants() -> None:
    c, clock, _, events = make()
    c.register_backend(Backend("be0", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=1000))
    c.register_backend(Backend("be1", "m2", "http://y", node="n0", gpu_id="g1", kv_budget_mib=1000))
    b = c.acquire(a_request("b", priority=P2, tenant="zed"), gpu_id="g0").lease
    a = c.acquire(a_request("a", priority=P2, tenant="amy"), gpu_id="g0").lease
    a2 = c.acquire(a_request("a2", priority=P2, tenant="amy"), gpu_id="g0").lease
    kv = c.acquire(replace(a_request("kv", vram_mib=100, priority=P2, tenant="kim"), model="m")).lease
    firm = c.acquire(a_request("firm", priority=P1, tenant="pat"), gpu_id="g0").lease
    kv_firm = c.acquire(replace(a_request("kvf", vram_mib=100, priority=P1, tenant="kay"), model="m")).lease
    c.acquire(a_request("elsewhere", priority=P2, tenant="eve"), gpu_id="g1")
    c.acquire(replace(a_request("kv-elsewhere", vram_mib=100, priority=P2, tenant="kev"), model="m2"))
    assert a and b and a2 and kv and firm and kv_firm
    ev = c.feed_reading(reading("g0", 39, clock))
    assert ev is not None and ev.kind == "pause" and ev.gpu_id == "g0"
    assert ev.lease_ids == tuple(sorted((a.id, b.id, a2.id, kv.id)))
    assert ev.tenants == ("amy", "kim", "zed")
    assert events[-1] == ev and c.paused_gpus() == {"g0"}
    assert c.readings["g0"].vram_used_mib == 39 * GIB


def test_a_resume_lets_queued_sheddable_work_onto_the_gpu_at_once() -> None:
    c, clock, _, events = make(a_slice("g0", gpu="g0", vram_gib=40))
    first = c.acquire(a_request("first", vram_gib=30, priority=P2))
    waiting = c.acquire(a_request("waiting", vram_gib=30, priority=P2))
    assert first.lease is not None and waiting.code is OutcomeCode.QUEUED and waiting.ticket
    assert c.feed_reading(reading("g0", 39, clock)) is not None  # paused
    c.release(first.lease.id)
    assert c.ticket(waiting.ticket).state == "queued"  # room, but the GPU is paused for P2
    ev = c.feed_reading(reading("g0", 10, clock))
    assert ev is not None and ev.kind == "resume" and c.paused_gpus() == set()
    st = c.ticket(waiting.ticket)
    assert st.state == "granted" and st.lease is not None
    assert [e.kind for e in events][-2:] == ["resume", "granted"]


def test_a_pause_does_not_pump_nor_change_the_queue() -> None:
    c, clock, _, _ = make(a_slice("g0", gpu="g0", vram_gib=40))
    c.acquire(a_request("first", vram_gib=30, priority=P1))
    waiting = c.acquire(a_request("waiting", vram_gib=30, priority=P1))
    assert waiting.ticket
    assert c.feed_reading(reading("g0", 39, clock)) is not None
    assert c.ticket(waiting.ticket).state == "queued" and len(c.queue) == 1


class Full(NamedTuple):
    c: LeaseController
    clock: ManualClock
    store: MemoryLeaseStore
    events: list[GatewayEvent]
    lid: str
    """The lease on g1 (tenant "h")."""
    ticket: str
    """The queued 30 GiB P1."""


def two_full_gpus() -> Full:
    """g0 and g1 each 30/40 GiB taken by P1 leases; a 30 GiB P1 waits."""
    c, clock, store, events = make()
    assert c.acquire(a_request("on-g0", vram_gib=30, priority=P1), gpu_id="g0").granted
    on_g1 = c.acquire(a_request("on-g1", vram_gib=30, priority=P1, tenant="h"), gpu_id="g1").lease
    waiting = c.acquire(a_request("waiting", vram_gib=30, priority=P1))
    assert on_g1 is not None and waiting.code is OutcomeCode.QUEUED and waiting.ticket
    return Full(c, clock, store, events, on_g1.id, waiting.ticket)


def test_drain_keeps_leases_by_default_closes_the_gpu_and_undrain_lets_the_queue_in() -> None:
    c, _, _, _, lid, ticket = two_full_gpus()
    kept = c.drain_gpu("g1")
    assert [x.id for x in kept] == [lid] and c.get(lid).state is LeaseState.ACTIVE
    assert c.drained == {"g1"} and not healthy(c, "g1")
    c.release(lid)
    assert c.ticket(ticket).state == "queued"  # g1 has room but is drained
    assert c.acquire(a_request("aimed", priority=P1), gpu_id="g1").code is OutcomeCode.UNRESOLVABLE
    c.undrain_gpu("g1")
    assert c.drained == set() and healthy(c, "g1")
    st = c.ticket(ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == ("g1",)


def test_marking_a_slice_of_a_drained_gpu_healthy_keeps_it_closed_until_undrain() -> None:
    c, _, _, _, lid, ticket = two_full_gpus()
    c.drain_gpu("g1")
    c.release(lid)
    assert c.mark_slice("g1", healthy=True) == ()
    assert not healthy(c, "g1") and c.ticket(ticket).state == "queued"  # no grant on the drained GPU
    c.undrain_gpu("g1")
    assert healthy(c, "g1") and c.ticket(ticket).state == "granted"


def test_drain_with_revoke_ends_the_leases_durably_with_the_given_or_default_reason() -> None:
    c, _, store, events, lid, ticket = two_full_gpus()
    out = c.drain_gpu("g1", revoke=True)
    assert [x.id for x in out] == [lid] and out[0].state is LeaseState.REVOKED
    assert out[0].reason == "GPU g1 drained"
    stored = store.get(lid)
    assert stored is not None and stored.state is LeaseState.REVOKED and stored.reason == "GPU g1 drained"
    revoked = [e for e in events if e.kind == "revoked"]
    assert [e.lease.id for e in revoked if e.lease] == [lid] and revoked[0].tenant == "h"
    assert c.ticket(ticket).state == "queued"  # the freed room is on the drained GPU
    c2, _, _, _, lid2, _ = two_full_gpus()
    assert c2.drain_gpu("g1", revoke=True, reason="maintenance")[0].reason == "maintenance"
    assert c2.get(lid2).reason == "maintenance"


def test_drain_and_undrain_of_an_unknown_gpu_raise_and_change_nothing() -> None:
    c, _, _, _, lid, ticket = two_full_gpus()
    for call in (lambda: c.drain_gpu("g9", revoke=True), lambda: c.undrain_gpu("g9")):
        with pytest.raises(UnknownId) as err:
            call()
        assert (err.value.kind, err.value.value) == ("gpu", "g9")
    assert c.drained == set() and c.get(lid).state is LeaseState.ACTIVE
    assert c.ticket(ticket).state == "queued"


def test_undrain_keeps_a_failed_gpu_closed_and_ok_health_keeps_a_drained_gpu_closed() -> None:
    c, clock, _, _ = make()
    c.drain_gpu("g1")
    c.feed_reading(reading("g1", 1, clock), health="failed", xids=(79,))
    c.undrain_gpu("g1")
    assert c.drained == set() and not healthy(c, "g1")  # still failed
    c.feed_reading(reading("g1", 1, clock), health="ok")
    assert healthy(c, "g1")
    c.drain_gpu("g1")
    c.feed_reading(reading("g1", 1, clock), health="degraded")
    c.feed_reading(reading("g1", 1, clock), health="ok")
    assert c.gpu_health["g1"] == "ok" and not healthy(c, "g1")  # still drained
    c.undrain_gpu("g1")
    assert healthy(c, "g1")


def test_degraded_keeps_leases_failed_revokes_them_naming_the_xids_and_ok_lets_the_queue_in() -> None:
    c, clock, store, _, lid, ticket = two_full_gpus()
    c.feed_reading(reading("g1", 30, clock), health="degraded")
    assert c.get(lid).state is LeaseState.ACTIVE and not healthy(c, "g1")
    c.feed_reading(reading("g1", 30, clock), health="failed", xids=(79, 48))
    lease = c.get(lid)
    assert lease.state is LeaseState.REVOKED and lease.reason == "GPU g1 failed (XID 79, 48)"
    assert store.get(lid) == lease
    assert c.ticket(ticket).state == "queued"  # room on g1, but g1 failed
    c.feed_reading(reading("g1", 1, clock), health="ok")
    st = c.ticket(ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == ("g1",)


def test_failed_without_xids_says_so_plainly_and_repeating_a_health_changes_nothing() -> None:
    c, clock, _, _, lid, _ = two_full_gpus()
    c.feed_reading(reading("g1", 30, clock), health="failed")
    assert c.get(lid).reason == "GPU g1 failed"
    c.mark_slice("g1", healthy=True)  # an operator reopens the slice; the GPU still reads failed
    c.feed_reading(reading("g1", 1, clock), health="failed", xids=(13,))
    assert healthy(c, "g1")  # same health again: not re-applied


def test_mark_slice_unhealthy_revokes_with_its_reason_and_healthy_lets_the_queue_in() -> None:
    c, _, _, _, lid, ticket = two_full_gpus()
    kept = c.mark_slice("g1", healthy=False)
    assert [x.id for x in kept] == [lid] and c.get(lid).state is LeaseState.ACTIVE
    out = c.mark_slice("g1", healthy=False, revoke=True)
    assert [x.reason for x in out] == ["marked unhealthy"] and c.get(lid).state is LeaseState.REVOKED
    assert c.ticket(ticket).state == "queued"
    assert c.mark_slice("g1", healthy=True) == ()
    st = c.ticket(ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == ("g1",)
    c2, _, _, _, lid2, _ = two_full_gpus()
    assert c2.mark_slice("g1", healthy=False, revoke=True, reason="ECC")[0].reason == "ECC"
    assert c2.get(lid2).reason == "ECC"


def test_mark_slice_of_an_unknown_slice_raises_and_changes_nothing() -> None:
    c, _, _, _, lid, _ = two_full_gpus()
    with pytest.raises(UnknownId):
        c.mark_slice("nope", healthy=False, revoke=True)
    assert c.get(lid).state is LeaseState.ACTIVE and healthy(c, "g0") and healthy(c, "g1")


def test_new_watermarks_apply_from_the_next_reading() -> None:
    c, clock, _, _ = make()
    assert c.feed_reading(reading("g0", 32, clock)) is None  # 80 % < 88 %
    c.set_watermarks(WatermarkConfig(vram_high=0.75, vram_low=0.5))
    ev = c.feed_reading(reading("g0", 32, clock))
    assert ev is not None and ev.kind == "pause" and c.paused_gpus() == {"g0"}
    assert c.acquire(a_request("p2", priority=P2), gpu_id="g0").code is OutcomeCode.BACKPRESSURE
    assert c.acquire(a_request("p0", priority=P0), gpu_id="g0").granted


def test_options_are_keyword_only_so_a_stray_positional_flag_is_refused() -> None:
    c, clock, _, _, lid, _ = two_full_gpus()
    for call in (
        lambda: c.feed_reading(reading("g0", 39, clock), "failed"),  # type: ignore[misc]
        lambda: c.drain_gpu("g1", True),  # type: ignore[misc]
        lambda: c.mark_slice("g1", False, True),  # type: ignore[misc]
    ):
        with pytest.raises(TypeError):
            call()
    assert c.get(lid).state is LeaseState.ACTIVE and healthy(c, "g1") and c.drained == set()
    assert c.paused_gpus() == set() and c.gpu_health == {}
