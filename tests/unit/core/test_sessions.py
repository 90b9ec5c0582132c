"""Sessions (`core/sessions.py`) in the controller's KV ledger: the session id's sources, routing to
the instance holding most of a session's prefix, the red-line prediction, retained prefixes as
preemptible leases reclaimed least recently used first through the preemption planner, the host tier
reclaimed prefixes move to, and the admission order (reclaim on the preferred instance, then another
instance with room, then reclaim elsewhere, then queue)."""

from __future__ import annotations

import itertools

import pytest

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import ManualClock
from gpupool.core.controller import KV_PREFIX, ControllerConfig, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Lease, LeaseState, Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import Backend, GatewayEvent
from gpupool.core.preemption import victim_order
from gpupool.core.sessions import (
    RATE_WEIGHT,
    RECOMPUTE_WEIGHT,
    RETAINED_PRIORITY,
    RETAINED_TENANT,
    is_retained,
    session_of,
)
from gpupool.hardware.units import Resources

MODEL = "qwen2.5-0.5b"
A, B = KV_PREFIX + "be0", KV_PREFIX + "be1"
_ids = itertools.count()


def _controller(budget: int = 1000, red: int = 90, backends: int = 2) -> tuple[LeaseController, ManualClock]:
    clock = ManualClock(1000.0)
    c = LeaseController(
        seed_example_pool(),
        clock=clock,
        store=MemoryLeaseStore(),
        config=ControllerConfig(kv_red_line_pct=red),
    )
    for i in range(backends):
        c.register_backend(Backend(f"be{i}", MODEL, "http://127.0.0.1:9", "gpu-b", "gpu-b/0", budget))
    return c, clock


def _req(mib: int, priority: int = 50) -> Request:
    return Request(
        id=f"r{next(_ids)}", tenant="t", priority=priority, demand=Resources(mib, 0), ttl_s=60.0, model=MODEL
    )


def _start(c: LeaseController, session: str, mib: int) -> Lease:
    prefer = c.sessions.prefer(session, mib, c.kv_load)
    out = c.acquire(_req(mib), prefer=prefer, session=session)
    assert out.granted and out.lease is not None, out
    c.session_begin(session, out.lease)
    c.check_invariants()
    return out.lease


def _finish(c: LeaseController, clock: ManualClock, session: str, lease: Lease, mib: int) -> None:
    clock.advance(1.0)
    c.release(lease.id)
    c.session_end(session, lease.grants[0].slice_id, mib)
    c.check_invariants()


def _turn(c: LeaseController, clock: ManualClock, session: str, mib: int) -> str:
    lease = _start(c, session, mib)
    _finish(c, clock, session, lease, mib)
    return lease.grants[0].slice_id


def _retained(c: LeaseController, slice_id: str) -> list[Lease]:
    return sorted((x for x in c.kv.leases if is_retained(x) and x.slice_ids == (slice_id,)), key=victim_order)


def test_session_id_header_then_user_then_prompt_cache_key() -> None:
    body = {"user": "u1", "prompt_cache_key": "k1"}
    assert session_of({"x-gpupool-session": "h1"}, body) == "h1"
    assert session_of({}, body) == "u1"
    assert session_of({}, {"prompt_cache_key": "k1"}) == "k1"
    assert session_of({}, {"user": "", "prompt_cache_key": "k1"}) == "k1"
    assert session_of({}, {"user": 7}) == ""
    assert session_of({}, {}) == ""


def test_the_red_line_is_the_kv_slice_capacity_and_bad_values_name_the_field() -> None:
    c, _ = _controller(budget=1000, red=90)
    assert c.kv.ledger.slice(A).capacity.vram_mib == 900
    assert c.acquire(_req(901)).code is OutcomeCode.UNRESOLVABLE  # over the red line even when idle
    assert c.acquire(_req(900)).granted  # at the line exactly: admitted
    with pytest.raises(InvalidInput, match="kv_red_line_pct"):
        _controller(red=0)
    with pytest.raises(InvalidInput, match="host_mib"):
        c.sessions.set_host_tier(A, -1)


def test_an_ended_turn_leaves_a_retained_preemptible_lease_and_the_next_turn_takes_it_back() -> None:
    c, clock = _controller()
    where = _turn(c, clock, "s", 300)
    (kept,) = _retained(c, where)
    assert kept.request.tenant == RETAINED_TENANT and kept.priority == RETAINED_PRIORITY
    assert kept.request.is_preemptible and kept.total.vram_mib == 300
    assert c.request_lease_count() == 0 and kept not in c.leases()  # not a request lease
    assert c.kv_load(where) == (0, 900)  # retained prefixes do not count against the red line
    # the next turn returns to the prefix (the other instance is more free) and holds it itself
    lease = _start(c, "s", 400)
    assert lease.grants[0].slice_id == where and not _retained(c, where)
    assert c.kv_load(where) == (400, 900)
    _finish(c, clock, "s", lease, 400)
    assert [x.total.vram_mib for x in _retained(c, where)] == [400]


def test_routes_to_the_instance_holding_most_of_the_prefix_unless_over_its_red_line() -> None:
    c, clock = _controller()
    c.sessions.set_host_tier(A, 1000)
    assert _turn(c, clock, "s", 100) == A
    hog = _start(c, "other", 500)
    assert hog.grants[0].slice_id == B  # B was the most free
    # s's prefix is on A, B is busier: 0 held + 400 <= 900 on A
    assert c.sessions.prefer("s", 400, c.kv_load) == A
    big = _start(c, "x", 850)  # no prefix anywhere: the most free (A), reclaiming s's prefix
    assert big.grants[0].slice_id == A
    r = c.sessions.residency("s", A)
    assert r is not None and (r.gpu_mib, r.host_mib) == (0, 100)
    # A now holds 850 by requests: 850 + 100 > 900 is over its red line, so no preference
    assert c.sessions.prefer("s", 100, c.kv_load) == ""
    assert c.sessions.red_line_hits == 1


def test_retained_prefixes_are_reclaimed_least_recently_used_first() -> None:
    c, clock = _controller(backends=1)
    for s in ("s1", "s2", "s3"):
        _turn(c, clock, s, 200)
    assert c.sessions.reclaim_order(A) == ["s1", "s2", "s3"]
    _turn(c, clock, "s1", 200)  # used again: last victim now
    assert c.sessions.reclaim_order(A) == ["s2", "s3", "s1"]
    running = _start(c, "s2", 200)  # a running turn holds its prefix in its request lease
    assert c.sessions.reclaim_order(A) == ["s3", "s1"]
    _finish(c, clock, "s2", running, 200)
    # the planner's own order for these leases: oldest grant first (other leases: youngest first)
    assert [x.request.labels[0][1] for x in _retained(c, A)] == ["s3", "s1", "s2"]


def test_a_request_reclaims_only_what_it_needs_and_the_victims_move_to_the_host_tier() -> None:
    c, clock = _controller(backends=1)
    c.sessions.set_host_tier(A, 250)
    for s in ("s1", "s2", "s3", "s4"):
        _turn(c, clock, s, 200)  # 800 of 900 retained
    ids = {x.request.labels[0][1]: x.id for x in _retained(c, A)}
    out = c.acquire(_req(400))  # 100 free: needs 300 more, the two least recently used
    assert out.granted
    assert c.sessions.reclaim_order(A) == ["s3", "s4"]
    assert [c.kv.get(ids[s]).state for s in ("s1", "s2", "s3")] == [
        LeaseState.PREEMPTED,
        LeaseState.PREEMPTED,
        LeaseState.ACTIVE,
    ]
    r1, r2 = c.sessions.residency("s1", A), c.sessions.residency("s2", A)
    assert r1 is not None and r2 is not None
    # both left the ledger for the engine's idle room (host tier 250 + KV capacity 900 MiB)
    assert (r1.gpu_mib, r1.host_mib) == (0, 200) and (r2.gpu_mib, r2.host_mib) == (0, 200)
    assert c.sessions.usage(A) == (400, 400) and c.sessions.reclaimed == 2
    # a host-tier copy still attracts the session's next turn
    assert c.sessions.prefer("s2", 100, c.kv_load) == A
    c.check_invariants()


def test_a_sessions_own_prefix_is_never_reclaimed_for_its_turn() -> None:
    c, clock = _controller(backends=1)
    _turn(c, clock, "old", 300)
    _turn(c, clock, "s", 500)  # 800 retained: old (LRU), then s
    lease = _start(c, "s", 700)  # 100 free + its own 500 + old's 300: old goes, s's is taken back
    assert lease.grants[0].slice_id == A
    r = c.sessions.residency("s", A)
    assert r is not None and r.pinned == 1 and not r.lease_id
    assert c.sessions.reclaim_order(A) == [] and c.sessions.reclaimed == 1


def test_admission_order_preferred_with_reclaim_then_free_elsewhere_then_reclaim_then_queue() -> None:
    c, clock = _controller()
    _turn(c, clock, "s", 400)  # A retains s's 400
    _turn(c, clock, "t", 300)  # on B, the most free (A has 500 free)
    _turn(c, clock, "u", 400)  # on B again (600 free there, 500 on A)
    assert c.sessions.reclaim_order(A) == ["s"] and c.sessions.reclaim_order(B) == ["t", "u"]
    # s's turn of 800 prefers A: 500 free + its own 400 fits without reclaiming anyone else
    lease = _start(c, "s", 800)
    assert lease.grants[0].slice_id == A and c.sessions.reclaimed == 0
    # a request with no session: A is full of requests, B has 200 free: reclaim t (LRU) on B
    other = c.acquire(_req(400)).lease
    assert other is not None and other.grants[0].slice_id == B
    assert c.sessions.reclaimed == 1 and c.sessions.reclaim_order(B) == ["u"]
    # nothing left to reclaim that would do: it queues (P1 waits), not 429
    out = c.acquire(_req(600))
    assert out.code is OutcomeCode.QUEUED and out.ticket
    # s's turn ends: the queued request gets A's room first; s's prefix goes to the host tier
    _finish(c, clock, "s", lease, 800)
    st = c.ticket(out.ticket)
    assert st.state == "granted" and st.lease is not None
    c.check_invariants()


def test_a_retained_prefix_without_room_reclaims_older_ones_or_goes_to_the_host_tier() -> None:
    c, clock = _controller(backends=1)
    c.sessions.set_host_tier(A, 300)  # reclaimed prefixes: 300 + the 900 of KV capacity, LRU
    _turn(c, clock, "s1", 400)
    _turn(c, clock, "s2", 400)
    _turn(c, clock, "s3", 400)  # its request reclaimed s1 (LRU) to fit
    assert c.sessions.reclaim_order(A) == ["s2", "s3"]
    # a turn ending with no free room: the oldest retained prefix gives way to the newest
    clock.advance(1.0)
    c.sessions.begin("s5", A)
    c.session_end("s5", A, 300)
    assert c.sessions.reclaim_order(A) == ["s3", "s5"]
    hold = c.acquire(_req(900)).lease  # takes the whole red line: s3, s5 reclaimed
    assert hold is not None and c.sessions.reclaim_order(A) == []
    c.sessions.begin("s6", A)
    c.session_end("s6", A, 100)  # nothing to reclaim: straight to the host tier
    # off the ledger, LRU within 1200 MiB: s1 (the oldest there) was pushed out by s5
    host = {s: r.host_mib for s in ("s1", "s2", "s3", "s5", "s6") if (r := c.sessions.residency(s, A))}
    assert host == {"s1": 0, "s2": 400, "s3": 400, "s5": 300, "s6": 100}
    assert c.sessions.usage(A) == (0, 1200)
    c.release(hold.id)
    c.check_invariants()


def test_a_queued_request_lease_granted_by_the_pump_emits_its_tickets_granted_event() -> None:
    # the proxy's waiter wakes on this event; without it a granted KV ticket waited for its deadline
    events: list[GatewayEvent] = []
    c = LeaseController(
        seed_example_pool(), clock=ManualClock(1.0), store=MemoryLeaseStore(), sink=events.append
    )
    c.register_backend(Backend("be0", MODEL, "http://127.0.0.1:9", "gpu-b", "gpu-b/0", 1000))
    first = c.acquire(_req(800)).lease
    out = c.acquire(_req(800))
    assert first is not None and out.code is OutcomeCode.QUEUED and out.ticket
    c.release(first.id)
    st = c.ticket(out.ticket)
    assert st.state == "granted" and st.lease is not None
    (ev,) = [e for e in events if e.ticket == out.ticket and e.kind == "granted"]
    assert ev.lease is not None and ev.lease.id == st.lease.id


def test_the_prefill_rate_is_a_moving_average_of_measured_first_tokens() -> None:
    c, _ = _controller()
    assert c.sessions.prefill_rate(A) == 0.0
    c.sessions.prefill_begin(A, 1000)
    c.sessions.prefill_done(A, 1000)  # no time given (the request ended without a first token)
    assert c.sessions.prefill_rate(A) == 0.0
    c.sessions.prefill_done(A, 1000, 2.0)
    assert c.sessions.prefill_rate(A) == 500.0
    c.sessions.prefill_done(A, 3000, 1.0)  # 3000 tok/s, weighted RATE_WEIGHT
    assert c.sessions.prefill_rate(A) == pytest.approx(500.0 + RATE_WEIGHT * 2500.0)
    assert c.sessions.prefill_rate(B) == 0.0


def test_a_running_turn_makes_its_instance_the_holder_and_patience_weighs_the_saved_recompute() -> None:
    c, clock = _controller()
    assert c.sessions.holder("s", 1000, 400) == ("", 1000, 0.0)
    lease = _start(c, "s", 300)  # running: the engine holds its prompt on the GPU
    where = lease.grants[0].slice_id
    r = c.sessions.residency("s", where)
    assert r is not None and r.pinned == 1 and r.gpu_mib == 300
    # no measured rate yet: the holder, the tokens it would compute there, no patience
    assert c.sessions.holder("s", 1000, 400) == (where, 250, 0.0)
    c.sessions.prefill_done(where, 2000, 1.0)  # 2000 tok/s there
    # it saves 750 tokens: waiting up to RECOMPUTE_WEIGHT x 750 / 2000 s costs less than recomputing
    assert c.sessions.holder("s", 1000, 400) == (where, 250, RECOMPUTE_WEIGHT * 750 / 2000)
    _finish(c, clock, "s", lease, 300)
    assert c.sessions.holder("s", 1000, 400)[:2] == (where, 250)  # now as a retained lease


def test_routing_counts_a_host_tier_holder_as_holding_the_prefix() -> None:
    c, clock = _controller()
    c.sessions.set_host_tier(A, 1000)
    assert _turn(c, clock, "s", 400) == A
    big = c.acquire(_req(800), prefer=A)  # s's prefix on A is reclaimed to A's host tier
    assert big.lease is not None and big.lease.grants[0].slice_id == A
    r = c.sessions.residency("s", A)
    assert r is not None and (r.gpu_mib, r.host_mib) == (0, 400)
    c.release(big.lease.id)
    hog = c.acquire(_req(300), prefer=A).lease  # A busier than B now
    assert hog is not None and hog.grants[0].slice_id == A
    # A: 300 waiting tokens + nothing to recompute < B: 16 x 1000; the host-tier copy is a hit
    c.sessions.prefill_begin(A, 300)
    assert c.sessions.route("s", 400, 1000, [A, B], c.kv_load) == (A, 0)
    assert c.sessions.holder("s", 1000, 400)[:2] == (A, 0)
    # a session with no prefix anywhere goes to the least loaded
    assert c.sessions.route("new", 400, 1000, [A, B], c.kv_load) == (B, 1000)


def _queue_turn(c: LeaseController, session: str, mib: int, prompt: int) -> str:
    """A turn that finds every instance over its red line: queued, waiting for its holder."""
    assert c.sessions.route(session, mib, prompt, [A, B], c.kv_load) == ("", prompt)
    holder, _, patience_s = c.sessions.holder(session, prompt, mib)
    out = c.acquire(_req(mib), session=session, wait_s=60.0, holder=holder, patience_s=patience_s)
    assert out.code is OutcomeCode.QUEUED and out.ticket, out
    return out.ticket


def test_a_queued_turn_waits_for_its_holder_while_patient_and_others_take_the_other_rooms() -> None:
    c, clock = _controller()
    assert _turn(c, clock, "s", 200) == A  # A retains s's 200
    hog_a = c.acquire(_req(700), prefer=A).lease
    hog_b = c.acquire(_req(900), prefer=B).lease
    assert hog_a is not None and hog_b is not None and hog_a.grants[0].slice_id == A
    c.sessions.prefill_done(A, 1000, 1.0)  # 1000 tok/s on A
    ticket = _queue_turn(c, "s", 400, 1000)  # saves 500 tokens: patient for 16 x 500 / 1000 = 8 s
    c.release(hog_b.id)  # B frees first: s's turn keeps waiting for A
    assert c.ticket(ticket).state == "queued"
    other = c.acquire(_req(400))  # and does not hold B against a request behind it
    assert other.lease is not None and other.lease.grants[0].slice_id == B
    clock.advance(1.0)
    c.release(hog_a.id)  # A frees: the turn goes there, to its own prefix
    st = c.ticket(ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == (A,)
    c.session_begin("s", st.lease)  # the proxy's call: the pump pinned it already, once
    r = c.sessions.residency("s", A)
    assert r is not None and r.pinned == 1 and not r.lease_id and r.gpu_mib == 400
    assert c.sessions.reclaimed == 0 and not c._begun_queued
    c.check_invariants()


def test_a_queued_turn_past_its_patience_takes_any_instance() -> None:
    c, clock = _controller()
    assert _turn(c, clock, "s", 200) == A
    hog_a = c.acquire(_req(700), prefer=A).lease
    hog_b = c.acquire(_req(900), prefer=B).lease
    assert hog_a is not None and hog_b is not None
    c.sessions.prefill_done(A, 1000, 1.0)
    ticket = _queue_turn(c, "s", 400, 1000)  # 8 s of patience
    clock.advance(8.5)
    c.release(hog_b.id)
    st = c.ticket(ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == (B,)
    c.session_begin("s", st.lease)
    r = c.sessions.residency("s", A)
    assert r is not None and r.lease_id and r.gpu_mib == 200  # its prefix on A stays retained
    c.check_invariants()


def test_a_turn_granted_on_its_holder_from_the_queue_reclaims_other_prefixes_lru_first() -> None:
    c, clock = _controller(backends=1)
    c.sessions.set_host_tier(A, 1000)
    for s in ("s", "o1", "o2"):
        _turn(c, clock, s, 200)  # 600 retained: s, o1, o2 (least recently used first)
    hog = c.acquire(_req(300)).lease
    assert hog is not None and c.kv.ledger.free(A).vram_mib == 0
    c.sessions.prefill_done(A, 1000, 1.0)
    holder, _, patience_s = c.sessions.holder("s", 1000, 700)
    assert holder == A and patience_s > 0
    # 0 free + its own 200 + o1's and o2's 400 < 700 before the hog ends: it queues
    out = c.acquire(_req(700), session="s", wait_s=60.0, holder=holder, patience_s=patience_s)
    assert out.code is OutcomeCode.QUEUED and out.ticket
    c.release(hog.id)  # 300 free + its own 200: 200 more from o1, the least recently used
    st = c.ticket(out.ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == (A,)
    c.session_begin("s", st.lease)
    assert c.sessions.reclaim_order(A) == ["o2"] and c.sessions.reclaimed == 1
    o1 = c.sessions.residency("o1", A)
    assert o1 is not None and (o1.gpu_mib, o1.host_mib) == (0, 200)
    c.check_invariants()


def test_a_queue_wait_for_a_holder_names_bad_values() -> None:
    c, _ = _controller()
    with pytest.raises(InvalidInput, match="patience_s"):
        c.acquire(_req(100), holder=A, patience_s=-1.0)
    with pytest.raises(InvalidInput, match="patience_s"):
        c.acquire(_req(100), holder=A, patience_s=float("nan"))
    with pytest.raises(InvalidInput, match="holder"):
        c.acquire(_req(100), holder="kv/nope", patience_s=1.0)
    assert c.request_lease_count() == 0


def test_a_turn_whose_holder_is_over_its_red_line_waits_for_it_once_a_rate_is_measured() -> None:
    c, clock = _controller()
    assert _turn(c, clock, "s", 200) == A
    hog = c.acquire(_req(700), prefer=A).lease  # A: 700 held by requests, B idle
    assert hog is not None and hog.grants[0].slice_id == A
    # no measured rate on A: over the red line there, the turn goes to B and recomputes
    assert c.sessions.route("s", 400, 1000, [A, B], c.kv_load) == (B, 1000)
    c.sessions.prefill_done(A, 1000, 1.0)
    # with one: it queues for A (the recompute it saves is worth 8 s of waiting) ...
    assert c.sessions.route("s", 400, 1000, [A, B], c.kv_load) == ("", 1000)
    holder, fresh, patience_s = c.sessions.holder("s", 1000, 400)
    assert (holder, fresh, patience_s) == (A, 500, RECOMPUTE_WEIGHT * 500 / 1000)
    out = c.acquire(_req(400), session="s", wait_s=60.0, holder=holder, patience_s=patience_s)
    assert out.code is OutcomeCode.QUEUED and out.ticket  # ... though B has room
    assert c.kv_load(B) == (0, 900)
    c.release(hog.id)
    st = c.ticket(out.ticket)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == (A,)
    # a holder with room grants at once, on the holder
    c.session_begin("s", st.lease)
    _finish(c, clock, "s", st.lease, 400)
    now = c.acquire(_req(400), session="s", holder=A, patience_s=1.0)
    assert now.lease is not None and now.lease.slice_ids == (A,)
    c.session_begin("s", now.lease)
    c.check_invariants()


def test_a_patient_turn_keeps_holding_its_holder_after_an_impatient_turn_for_the_same_holder_missed() -> None:
    """Two turns wait for the same holder A; the first is past its patience (it may take any
    instance, and waits for the most free one, C), the second is not. In a pump pass the first
    misses everywhere; the second must still hold A (a new request must not take the room that
    frees there), not be answered "blocked, holding nothing" as if the first held its target."""
    c, clock = _controller(backends=3)
    C = KV_PREFIX + "be2"
    for s in ("s1", "s2"):
        turn = c.acquire(_req(100), prefer=A, session=s).lease
        assert turn is not None and turn.slice_ids == (A,)
        c.session_begin(s, turn)
        _finish(c, clock, s, turn, 100)
    hog_a = c.acquire(_req(200), prefer=A).lease
    hog_a2 = c.acquire(_req(500), prefer=A).lease
    hog_b = c.acquire(_req(900), prefer=B).lease
    hog_c = c.acquire(_req(300), prefer=C).lease
    assert all(x is not None for x in (hog_a, hog_a2, hog_b, hog_c))
    assert hog_a2 is not None and hog_a2.slice_ids == (A,) and c._room(C)[0] == 600
    c.sessions.prefill_done(A, 1000, 1.0)
    routes = c.sessions.route("s1", 800, 800, [A, B, C], c.kv_load)
    assert routes == ("", 800)
    t1 = _queue_turn(c, "s1", 800, 800)  # patient 16 x 100 / 1000 = 1.6 s
    t2 = _queue_turn(c, "s2", 850, 8500)  # patient 16 s
    clock.advance(2.0)
    c.release(hog_a2.id)  # A: 500 free; s1 (past its patience) misses everywhere, s2 misses on A
    assert c.ticket(t1).state == "queued" and c.ticket(t2).state == "queued"
    assert A in c.queue.avoid(50)
    out = c.acquire(_req(450), wait_s=1.0)  # fits A's 500 free, but s2 waits there
    assert out.lease is None or out.lease.slice_ids != (A,), out
    c.check_invariants()


def test_room_that_frees_on_a_holder_goes_to_the_turn_waiting_for_it_not_to_a_request_queued_earlier() -> (
    None
):
    """A request with no prefix anywhere queued first could take any instance; the turn queued after
    it can use only its holder A. When A frees, the turn gets it: anything admitted there first
    would evict the idle prefix the turn waits for. The other request waits for another instance."""
    c, clock = _controller()
    assert _turn(c, clock, "s", 200) == A
    hog_a = c.acquire(_req(700), prefer=A).lease
    hog_b = c.acquire(_req(900), prefer=B).lease
    assert hog_a is not None and hog_b is not None and hog_a.slice_ids == (A,)
    c.sessions.prefill_done(A, 1000, 1.0)
    plain = c.acquire(_req(400), wait_s=60.0)
    assert plain.code is OutcomeCode.QUEUED and plain.ticket
    turn = _queue_turn(c, "s", 600, 1000)  # 16 x 333 / 1000: patient about 5 s
    c.release(hog_a.id)  # 700 free on A (+ the turn's own 200)
    st = c.ticket(turn)
    assert st.state == "granted" and st.lease is not None and st.lease.slice_ids == (A,)
    assert c.ticket(plain.ticket).state == "queued"
    c.session_begin("s", st.lease)
    c.release(hog_b.id)
    other = c.ticket(plain.ticket)
    assert other.state == "granted" and other.lease is not None and other.lease.slice_ids == (B,)
    c.check_invariants()


def test_a_turn_routed_to_its_holder_queues_for_it_when_queued_requests_hold_the_room_there() -> None:
    c, clock = _controller()
    for s in ("s", "o"):
        turn = c.acquire(_req(100), prefer=A, session=s).lease
        assert turn is not None and turn.slice_ids == (A,)
        c.session_begin(s, turn)
        _finish(c, clock, s, turn, 100)
    hog_a = c.acquire(_req(500), prefer=A).lease
    assert hog_a is not None and hog_a.slice_ids == (A,)
    c.sessions.prefill_done(A, 1000, 1.0)
    waiting = _queue_turn(c, "o", 800, 8000)  # o waits for A
    prefer, _ = c.sessions.route("s", 150, 1500, [A, B], c.kv_load)
    holder, _, patience_s = c.sessions.holder("s", 1500, 150)
    assert prefer == holder == A and patience_s > 0
    out = c.acquire(_req(150), prefer=prefer, session="s", wait_s=60.0, holder=holder, patience_s=patience_s)
    assert out.code is OutcomeCode.QUEUED and out.ticket, out  # not sent to B, away from its prefix
    assert c.ticket(waiting).state == "queued"
    c.check_invariants()
