"""KV-share delegation to proxy replicas (`core/kvshares.py` on the leader, `core/kvreplica.py` on a
replica): the leader's shares are leases in the KV ledger, renewed with expiry and rebalanced by
demand; replicas grant request leases locally inside them.

What must hold, whatever the interleaving of grants, releases, share calls that are delayed,
reordered, retried or lost, replica deaths and the clock (Hypothesis state machine):
- the sum of the shares (plus any other KV lease) never exceeds a backend's budget;
- a replica never grants beyond its share: used <= cap <= share in every book;
- while a replica may still grant in a share (its validity has not passed on its clock), the
  leader holds an unexpired share lease for it at least that large: the room is never handed to
  another replica meanwhile;
- a replica that dies loses only its share, and only until the share lease expires: afterwards the
  room is free again for the others.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpupool.core.allocator import Allocator
from gpupool.core.clock import ManualClock
from gpupool.core.errors import InvalidInput
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.kvreplica import ReplicaShares
from gpupool.core.kvshares import (
    SHARE_TENANT,
    ShareDelegator,
    ShareGrant,
    ShareReport,
    StaleShareReport,
    fair_shares,
)
from gpupool.core.model import Lease, LeaseState, Request
from gpupool.core.ports import Backend
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

MODEL = "m"
TTL_S = 3.0
_ids = itertools.count()


def _backend(bid: str, budget: int) -> Backend:
    return Backend(bid, MODEL, f"http://127.0.0.1:9/{bid}", "n0", f"n0/{bid}", budget)


def _leader(clock: ManualClock, backends: dict[str, Backend]) -> tuple[Allocator, ShareDelegator]:
    kv = Allocator((), clock=clock, lease_ids=seeded_lease_ids(1))
    for b in backends.values():
        kv.add_slice(
            Slice(
                id=KV_PREFIX + b.id,
                node=b.node,
                gpu_id=b.gpu_id,
                kind=SliceKind.MPS,
                capacity=Resources(b.kv_budget_mib, 1000),
                profile=f"kv:{b.model}",
            )
        )
    return kv, ShareDelegator(kv, backends=lambda: backends)


def _req(mib: int, *, priority: int = 50) -> Request:
    return Request(
        id=f"r{next(_ids)}", tenant="t", priority=priority, demand=Resources(mib, 0), ttl_s=60.0, model=MODEL
    )


def _replica(clock: ManualClock, seed: int) -> ReplicaShares:
    return ReplicaShares(now=clock.now, lease_ids=lambda: f"lease-{seed}-{next(_ids)}")


def _call(
    d: ShareDelegator, r: ReplicaShares, name: str, backends: dict[str, Backend]
) -> dict[str, ShareGrant]:
    seq, reports = r.report()
    grants = d.renew(name, "i0", seq, reports, ttl_s=TTL_S)
    r.set_backends(backends)
    assert r.apply(seq, TTL_S, grants)
    return grants


# ---------------------------------------------------------------------- fair_shares
@given(
    st.integers(min_value=0, max_value=10_000),
    st.dictionaries(
        st.text("abcd", min_size=1, max_size=3), st.integers(min_value=0, max_value=5_000), max_size=6
    ),
)
def test_fair_shares_are_max_min_fair_and_never_exceed_the_pool(pool: int, wants: dict[str, int]) -> None:
    out = fair_shares(pool, wants)
    assert set(out) == set(wants)
    assert sum(out.values()) <= pool
    assert all(0 <= out[h] <= wants[h] for h in wants)
    if sum(wants.values()) <= pool:
        assert out == wants
    else:
        assert sum(out.values()) == pool  # nothing left idle while someone wants more
    for h, want in wants.items():
        if out[h] < want:  # a replica short of its want gets at least everyone else's share
            assert all(out[h] >= out[k] - 1 for k in wants)


# ---------------------------------------------------------------------- examples
def test_a_replica_grows_its_share_by_demand_and_grants_inside_it_only() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1600)}
    kv, d = _leader(clock, backends)
    r = _replica(clock, 1)
    _call(d, r, "r1", backends)  # learns the backends: nothing held, nothing wanted yet
    g = _call(d, r, "r1", backends)["b0"]
    assert g.share_mib == 100  # headroom: a sixteenth of the budget
    assert r.grant(_req(60)) is not None
    assert r.grant(_req(60)) is None  # 120 > 100: never beyond the share
    r.refused(MODEL, 60)
    g = _call(d, r, "r1", backends)["b0"]
    assert g.share_mib == 60 + 60 + 100 and r.grant(_req(60)) is not None
    assert list(d.shares("b0").values()) == [220]
    lease = kv.leases.active(_share_lease_id(kv))
    assert lease is not None and lease.request.tenant == SHARE_TENANT
    assert lease.total.vram_mib == 220  # the share is a lease in the KV ledger
    d.check()
    r.check()


def _share_lease_id(kv: Allocator) -> str:
    ids = [x.id for x in kv.leases if x.request.tenant == SHARE_TENANT]
    assert len(ids) == 1
    return ids[0]


def test_shares_rebalance_by_demand_and_shrink_only_what_the_holder_does_not_use() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    _, d = _leader(clock, backends)
    a, b = _replica(clock, 1), _replica(clock, 2)
    for r, n in ((a, "a"), (b, "b")):
        _call(d, r, n, backends)
    held: list[Lease] = []
    for _ in range(12):  # a fills its share, asks for more, and so on while b is idle
        while (x := a.grant(_req(50))) is not None:
            held.append(x)
        a.refused(MODEL, 50)
        _call(d, a, "a", backends)
    assert a.usage("b0")[2] >= 900
    for _ in range(3):  # b wants 400: a's fair target falls, but a keeps every MiB it uses
        b.refused(MODEL, 400)
        _call(d, b, "b", backends)
        _call(d, a, "a", backends)
        assert a.usage("b0")[0] >= a.usage("b0")[2] >= 900
    assert b.usage("b0")[0] <= 1000 - a.usage("b0")[2]
    for x in held[10:]:  # a's use falls to 500: its next call gives the rest back to b
        a.end(x.id, LeaseState.RELEASED, "done")
    seq, reports = a.report()
    hold = reports["b0"].hold_mib
    assert 500 <= hold < 1000 and a.usage("b0")[1] == hold  # from now on a never uses more than hold
    while a.grant(_req(50)) is not None:
        pass
    assert a.usage("b0")[2] <= hold
    assert a.apply(seq, TTL_S, d.renew("a", "i0", seq, reports, ttl_s=TTL_S))
    b.refused(MODEL, 400)
    _call(d, b, "b", backends)
    sa, sb = a.usage("b0")[0], b.usage("b0")[0]
    assert sa >= 500 and sb >= 400 and sa + sb <= 1000
    d.check()
    a.check()
    b.check()


def test_a_dead_replica_loses_only_its_share_and_only_until_it_expires() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    _, d = _leader(clock, backends)
    a, b = _replica(clock, 1), _replica(clock, 2)
    _call(d, a, "a", backends)
    _call(d, b, "b", backends)
    for _ in range(8):  # a uses what it gets and asks for more
        while a.grant(_req(50)) is not None:
            pass
        a.refused(MODEL, 50)
        _call(d, a, "a", backends)
    dead = a.usage("b0")[0]
    assert dead > 500
    # a dies (never calls again); b wants everything
    for _ in range(3):
        clock.advance(0.5)
        b.refused(MODEL, 1000)
        _call(d, b, "b", backends)
    assert b.usage("b0")[0] <= 1000 - dead  # a's share is still held
    clock.advance(TTL_S)
    b.refused(MODEL, 1000)
    _call(d, b, "b", backends)
    b.refused(MODEL, 1000)
    _call(d, b, "b", backends)
    assert "a/i0" not in d.shares("b0") and b.usage("b0")[0] == 1000
    d.check()


def test_a_share_lapses_on_the_replica_before_the_leader_lets_it_go() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    kv, d = _leader(clock, backends)
    a = _replica(clock, 1)
    _call(d, a, "a", backends)
    _call(d, a, "a", backends)
    lease = a.grant(_req(10))
    assert lease is not None
    clock.advance(TTL_S * 0.95)  # past the replica's validity, before the leader's expiry
    a.expire_due()
    assert a.get(lease.id) is not None and a.get(lease.id).state is LeaseState.REVOKED  # type: ignore[union-attr]
    assert a.grant(_req(10)) is None and a.usage("b0")[:3] == (0, 0, 0)
    assert kv.leases.active(_share_lease_id(kv)) is not None  # the leader still holds it


def test_stale_and_bad_calls_change_nothing() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    kv, d = _leader(clock, backends)
    a = _replica(clock, 1)
    _call(d, a, "a", backends)
    seq1, rep1 = a.report()
    seq2, rep2 = a.report()  # the first call timed out; a second one goes
    g2 = d.renew("a", "i0", seq2, rep2, ttl_s=TTL_S)
    with pytest.raises(StaleShareReport):
        d.renew("a", "i0", seq1, rep1, ttl_s=TTL_S)
    assert not a.apply(seq1, TTL_S, g2)  # an answer to an older call is ignored
    assert a.apply(seq2, TTL_S, g2)
    before = [(x.id, x.total) for x in kv.leases]
    for bad in (
        {"ttl_s": 0.1},
        {"ttl_s": float("nan")},
        {"reports": {"nope": ShareReport(0, 0, 1)}},
        {"reports": {"b0": ShareReport(-1, 0, 1)}},
        {"replica": ""},
        {"replica": "a/b"},
        {"seq": -1},
    ):
        args = {"replica": "a", "seq": 99, "reports": {}, "ttl_s": TTL_S} | bad
        with pytest.raises(InvalidInput):
            d.renew(str(args["replica"]), "i0", int(args["seq"]), args["reports"], ttl_s=args["ttl_s"])  # type: ignore[arg-type]
    assert [(x.id, x.total) for x in kv.leases] == before


def test_a_call_claiming_more_than_its_share_keeps_only_its_share() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    _, d = _leader(clock, backends)
    a, b = _replica(clock, 1), _replica(clock, 2)
    _call(d, a, "a", backends)
    _call(d, b, "b", backends)
    _call(d, a, "a", backends)
    _call(d, b, "b", backends)
    before = a.usage("b0")[0]
    b.refused(MODEL, 1000)
    _call(d, b, "b", backends)  # b takes the rest of the budget: nothing is free
    g = d.renew("a", "i0", 99, {"b0": ShareReport(before + 50, 0, 1000)}, ttl_s=TTL_S)["b0"]
    assert g.share_mib == before  # the claimed extra 50 MiB are not a's
    d.check()


def test_no_share_grows_on_a_backend_that_queued_requests_hold_and_unused_room_goes_back() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    kv = Allocator((), clock=clock, lease_ids=seeded_lease_ids(1))
    kv.add_slice(Slice("kv/b0", "n0", "n0/b0", SliceKind.MPS, Resources(1000, 1000), profile="kv:m"))
    held: list[frozenset[str]] = [frozenset({"kv/b0"})]
    d = ShareDelegator(kv, backends=lambda: backends, held=lambda: held[0])
    a = _replica(clock, 1)
    _call(d, a, "a", backends)
    assert _call(d, a, "a", backends)["b0"].share_mib == 0
    held[0] = frozenset()
    assert _call(d, a, "a", backends)["b0"].share_mib > 0
    lease = a.grant(_req(10))
    assert lease is not None
    held[0] = frozenset({"kv/b0"})  # online requests queue at the leader: a keeps only what it uses
    g = _call(d, a, "a", backends)["b0"]
    assert g.target_mib == 10
    assert _call(d, a, "a", backends)["b0"].share_mib == 10


def test_a_share_on_an_unhealthy_slice_is_kept_while_it_drains_and_never_grows() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000)}
    kv, d = _leader(clock, backends)
    a, b = _replica(clock, 1), _replica(clock, 2)
    _call(d, a, "a", backends)
    _call(d, a, "a", backends)
    lease = a.grant(_req(20))
    assert lease is not None
    kv.mark_unhealthy("kv/b0")  # GPU degraded: no new room there
    g = _call(d, a, "a", backends)["b0"]
    assert g.share_mib >= 20 and g.target_mib == 20 and a.get(lease.id).state is LeaseState.ACTIVE  # type: ignore[union-attr]
    a.refused(MODEL, 500)
    assert _call(d, a, "a", backends)["b0"].share_mib == 20  # drained to its use, never grown
    _call(d, b, "b", backends)
    assert _call(d, b, "b", backends)["b0"].share_mib == 0  # nobody new gets room there
    d.check()


def test_a_clean_stop_gives_every_share_back_at_once() -> None:
    clock = ManualClock(100.0)
    backends = {"b0": _backend("b0", 1000), "b1": _backend("b1", 500)}
    kv, d = _leader(clock, backends)
    a = _replica(clock, 1)
    _call(d, a, "a", backends)
    _call(d, a, "a", backends)
    assert len(list(kv.leases)) == 2
    assert d.release_all("a", "i0") == 2 and not list(kv.leases)


# ---------------------------------------------------------------------- the state machine
class Delegation(RuleBasedStateMachine):
    """A leader (KV allocator + delegator) and three replicas on one clock; every message of the
    share protocol is in flight until a rule delivers it (in any order), loses it or retries."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.backends = {"b0": _backend("b0", 400), "b1": _backend("b1", 160)}  # tight: targets bind
        self.kv, self.d = _leader(self.clock, self.backends)
        self.names = ("r0", "r1", "r2")
        self.replicas = {n: _replica(self.clock, i) for i, n in enumerate(self.names)}
        for r in self.replicas.values():
            r.set_backends(self.backends)
        self.dead: set[str] = set()
        self.requests: list[tuple[str, int, dict[str, ShareReport]]] = []
        self.answers: list[tuple[str, int, dict[str, ShareGrant]]] = []
        self.others: list[str] = []
        self.revoked: dict[str, float] = {}
        """backend -> when the leader last revoked its shares (a failed GPU)."""
        self.stale = 0

    def _alive(self, i: int) -> str | None:
        live = [n for n in self.names if n not in self.dead]
        return live[i % len(live)] if live else None

    @rule(i=st.integers(0, 2), mib=st.integers(1, 120), b=st.sampled_from(["", "kv/b0", "kv/b1"]))
    def grant(self, i: int, mib: int, b: str) -> None:
        n = self._alive(i)
        if n is None:
            return
        r = self.replicas[n]
        before = {bid: r.usage(bid) for bid in self.backends}
        lease = r.grant(_req(mib), prefer=b)
        if lease is None:
            r.refused(MODEL, mib)
            return
        bid = lease.grants[0].slice_id[len(KV_PREFIX) :]
        share, cap, used, _ = before[bid]
        assert used + mib <= cap <= share  # never beyond the share
        assert r.valid(bid)  # and never in a share past its validity

    @rule(i=st.integers(0, 2))
    def fill(self, i: int) -> None:
        """A burst: the replica grants until its shares are full (demand then exceeds them)."""
        n = self._alive(i)
        if n is None:
            return
        r = self.replicas[n]
        while r.grant(_req(20)) is not None:
            pass
        r.refused(MODEL, 40)

    @rule(i=st.integers(0, 2), mib=st.integers(50, 400))
    def want_more(self, i: int, mib: int) -> None:
        """Demand the replica could not serve (its next call asks for it: fair targets then bind)."""
        n = self._alive(i)
        if n is not None:
            self.replicas[n].refused(MODEL, mib)

    @rule(i=st.integers(0, 2), k=st.integers(0, 50))
    def release(self, i: int, k: int) -> None:
        n = self._alive(i)
        if n is None:
            return
        r = self.replicas[n]
        active = sorted(x.id for x in r.active())
        if active:
            r.end(active[k % len(active)], LeaseState.RELEASED, "done")

    @rule(i=st.integers(0, 2))
    def send(self, i: int) -> None:
        n = self._alive(i)
        if n is not None:
            seq, reports = self.replicas[n].report()
            self.requests.append((n, seq, reports))

    @rule(i=st.integers(0, 2))
    def round_trip(self, i: int) -> None:
        """A share call answered at once (the common case; the rules above split it up)."""
        n = self._alive(i)
        if n is None:
            return
        r = self.replicas[n]
        seq, reports = r.report()
        self.a_valid_share_is_covered_by_an_unexpired_leader_lease()  # (while it is in flight)
        grants = self.d.renew(n, "i0", seq, reports, ttl_s=TTL_S)
        self.a_valid_share_is_covered_by_an_unexpired_leader_lease()
        r.apply(seq, TTL_S, grants)

    @precondition(lambda self: bool(self.requests))
    @rule(k=st.integers(0, 10), lose=st.booleans())
    def deliver_request(self, k: int, lose: bool) -> None:
        n, seq, reports = self.requests.pop(k % len(self.requests))
        if lose:
            return
        try:
            grants = self.d.renew(n, "i0", seq, reports, ttl_s=TTL_S)
        except StaleShareReport:
            self.stale += 1
            return
        for bid, g in grants.items():
            assert 0 <= g.share_mib <= self.backends[bid].kv_budget_mib
        self.answers.append((n, seq, grants))

    @precondition(lambda self: bool(self.answers))
    @rule(k=st.integers(0, 10), lose=st.booleans())
    def deliver_answer(self, k: int, lose: bool) -> None:
        n, seq, grants = self.answers.pop(k % len(self.answers))
        if not lose and n not in self.dead:
            self.replicas[n].apply(seq, TTL_S, grants)

    @rule(i=st.integers(0, 2))
    def die(self, i: int) -> None:
        n = self._alive(i)
        if n is not None and len(self.dead) < 2:
            self.dead.add(n)
            for x in list(self.replicas[n].active()):  # its process is gone: so are its requests
                self.replicas[n].end(x.id, LeaseState.REVOKED, "process died")

    @rule(mib=st.integers(1, 150), b=st.sampled_from(["b0", "b1"]))
    def leader_local_lease(self, mib: int, b: str) -> None:
        out = self.kv.place(_req(mib), (KV_PREFIX + b,))
        if out.lease is not None:
            self.others.append(out.lease.id)

    @rule(b=st.sampled_from(["kv/b0", "kv/b1"]), healthy=st.booleans(), revoke=st.booleans())
    def slice_health(self, b: str, healthy: bool, revoke: bool) -> None:
        """The GPU under a budget degrades (shares kept, not grown) or fails (shares revoked)."""
        if healthy:
            self.kv.mark_healthy(b)
        else:
            self.kv.mark_unhealthy(b, revoke=revoke, reason="gpu failed")
            if revoke:  # the leader revoked the shares there: each replica learns it at its next call
                self.revoked[b[len(KV_PREFIX) :]] = self.clock.now()

    @precondition(lambda self: bool(self.others))
    @rule()
    def leader_local_release(self) -> None:
        self.kv.release(self.others.pop(0))

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.5]), expire=st.booleans())
    def tick(self, dt: float, expire: bool) -> None:
        self.clock.advance(dt)
        for r in self.replicas.values():
            if expire:  # (otherwise the next grant must notice the lapse itself)
                r.expire_due()

    @invariant()
    def ledger_and_books_hold(self) -> None:
        self.kv.check_invariants()
        self.d.check()
        for r in self.replicas.values():
            r.check()

    @invariant()
    def a_valid_share_is_covered_by_an_unexpired_leader_lease(self) -> None:
        now = self.clock.now()
        for bid, b in self.backends.items():
            total = 0
            for n, r in self.replicas.items():
                if n in self.dead or not r.valid(bid):
                    continue
                sent_at = r._books[bid].valid_until - TTL_S * (1 - r.margin)
                if bid in self.revoked and sent_at <= self.revoked[bid]:
                    continue  # a share the leader revoked (GPU failed) since this replica's last call
                _, cap, used, _ = r.usage(bid)
                mine = [
                    x
                    for x in self.kv.leases
                    if x.request.tenant == SHARE_TENANT
                    and x.request.id == f"kv-share:{n}/i0:{bid}"
                    and x.expires_at > now
                ]
                assert mine and mine[0].total.vram_mib >= cap >= used, (n, bid, cap, used)
                total += cap
            assert total <= b.kv_budget_mib

    @invariant()
    def a_dead_replicas_share_is_gone_after_its_ttl(self) -> None:
        now = self.clock.now()
        for x in self.kv.leases:
            if x.request.tenant == SHARE_TENANT:
                assert x.expires_at <= now + TTL_S  # nothing outlives one TTL without a call


TestDelegation = Delegation.TestCase
TestDelegation.settings = settings(max_examples=200, stateful_step_count=80, deadline=None)
