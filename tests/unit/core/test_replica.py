"""`ProxyReplica` (`core/replica.py`): the calls the OpenAI proxy makes on a replica, answered like
the `LeaseController`'s: granted inside a share, or queued until a share grows or a lease ends
(highest priority first), shed at the deadline, unresolvable when no budget of the model could ever
hold it; P2 requests are not granted on a backend the leader reports PAUSED; every grant or shed of
a waiting request is announced to the sink with its ticket."""

from __future__ import annotations

import itertools

import pytest

from gpupool.core.clock import ManualClock
from gpupool.core.errors import UnknownId
from gpupool.core.kvshares import ShareGrant
from gpupool.core.model import Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import Backend, GatewayEvent
from gpupool.core.replica import ProxyReplica, ReplicaConfig
from gpupool.hardware.units import Resources

MODEL = "m"
_ids = itertools.count()
B0 = Backend("b0", MODEL, "http://127.0.0.1:9", "n0", "n0/0", 1000)


def _replica(share_mib: int = 100) -> tuple[ProxyReplica, ManualClock, list[GatewayEvent]]:
    clock = ManualClock(10.0)
    events: list[GatewayEvent] = []
    r = ProxyReplica(
        clock=clock,
        lease_ids=lambda: f"l{next(_ids)}",
        ticket_ids=lambda: f"t{next(_ids)}",
        config=ReplicaConfig(max_wait_s=2.0),
        sink=events.append,
    )
    _answer(r, share_mib)
    return r, clock, events


def _answer(r: ProxyReplica, share_mib: int, paused: frozenset[str] = frozenset()) -> None:
    seq, _ = r.share_report()
    assert r.share_answer(seq, 3.0, {"b0": B0}, {"b0": ShareGrant(share_mib, share_mib)}, paused)


def _req(mib: int, priority: int = 50, model: str = MODEL) -> Request:
    return Request(f"r{next(_ids)}", "t", priority, Resources(mib, 0), 60.0, model=model)


def test_grants_inside_the_share_then_queues_and_asks_for_a_renewal() -> None:
    r, _, events = _replica(100)
    a = r.acquire(_req(60))
    assert a.code is OutcomeCode.GRANTED and a.lease is not None
    assert r.backend_of(a.lease) == B0 and r.lane.load("kv/b0") == (60, 1000)
    q = r.acquire(_req(60))
    assert q.code is OutcomeCode.QUEUED and q.ticket and r.renewal_wanted()
    assert r.ticket(q.ticket).state == "queued"
    _, reports = r.share_report()
    assert reports["b0"].want_mib >= 60 + 60  # the refused demand is asked for
    assert not r.renewal_wanted()
    r.release(a.lease.id)  # room again: the waiting request gets it
    st = r.ticket(q.ticket)
    assert st.state == "granted" and st.lease is not None
    assert [e.kind for e in events] == ["granted"] and events[0].ticket == q.ticket
    r.check_invariants()


def test_a_grown_share_grants_waiting_requests_highest_priority_first() -> None:
    r, _, _ = _replica(10)
    low = r.acquire(_req(50, priority=-1))
    high = r.acquire(_req(50, priority=100))
    assert low.code is high.code is OutcomeCode.QUEUED
    _answer(r, 60)  # room for one: the P0 goes first though it came second
    assert r.ticket(str(high.ticket)).state == "granted"
    assert r.ticket(str(low.ticket)).state == "queued"


def test_waits_past_the_deadline_are_shed_and_cancel_ends_a_wait() -> None:
    r, clock, events = _replica(10)
    a = r.acquire(_req(50))
    b = r.acquire(_req(50))
    assert r.cancel(str(b.ticket)).state == "cancelled"
    clock.advance(2.5)
    r.tick()
    assert r.ticket(str(a.ticket)).state == "shed" and r.shed == 1
    assert [e.kind for e in events] == ["cancelled", "shed"]
    with pytest.raises(UnknownId):
        r.ticket(str(a.ticket), tenant="someone-else")


def test_unknown_models_and_requests_larger_than_every_budget_are_unresolvable() -> None:
    r, _, _ = _replica(100)
    assert r.acquire(_req(10, model="nope")).code is OutcomeCode.UNRESOLVABLE
    out = r.acquire(_req(1001))
    assert out.code is OutcomeCode.UNRESOLVABLE and "1000 MiB" in out.reason


def test_sheddable_requests_are_not_granted_on_a_paused_backend() -> None:
    r, _, _ = _replica(100)
    _answer(r, 100, paused=frozenset({"b0"}))
    assert r.acquire(_req(10, priority=-1)).code is OutcomeCode.QUEUED
    assert r.acquire(_req(10, priority=50)).code is OutcomeCode.GRANTED  # (a waiting P2 is no obstacle)


def test_a_lapsed_share_grants_nothing_and_revokes_its_leases() -> None:
    r, clock, _ = _replica(100)
    a = r.acquire(_req(10))
    assert a.lease is not None
    clock.advance(3.0)  # past sent_at + 0.9 x ttl: no renewal came
    out = r.acquire(_req(10))
    assert out.code is OutcomeCode.QUEUED
    assert r.release(a.lease.id).code is OutcomeCode.ALREADY_ENDED
    with pytest.raises(UnknownId):
        r.release("no-such-lease")
