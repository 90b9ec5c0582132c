"""Edges of `AdmissionQueue` and `AdmissionConfig`: the documented defaults and every validation
bound, the deficit-round-robin order against a plain reference implementation (the idle-round skip
must not change it), the minimum-share window and its boundary, the band boundaries of `avoid` and
of the holds `drain` offers, deadlines equal to ``now`` and across heap compaction, `Ticketed` cost,
scope and immutability."""

from __future__ import annotations

import dataclasses
import random
from collections import deque

import pytest

from gpupool.core import InvalidInput
from gpupool.core.admission import NOTHING, AdmissionConfig, AdmissionQueue, Ticketed, TryGrant, Verdict
from gpupool.core.model import Request
from gpupool.hardware.units import Resources


def a_ticket(
    q: AdmissionQueue,
    t: str,
    *,
    prio: int = 10,
    tenant: str = "a",
    vram_mib: int = 1024,
    gpu_count: int = 1,
    model: str = "",
    kv: bool = False,
    deadline: float = 100.0,
) -> Ticketed:
    req = Request(
        id=t,
        tenant=tenant,
        priority=prio,
        demand=Resources(vram_mib, 0),
        ttl_s=60.0,
        gpu_count=gpu_count,
        model=model,
    )
    return Ticketed(ticket=t, request=req, enqueued_at=0.0, deadline_at=deadline, seq=q.next_seq(), kv=kv)


def test_documented_defaults() -> None:
    c = AdmissionConfig()
    assert (c.max_per_band, c.max_total, c.quantum_mib, c.share_window) == (1024, 4096, 8192, 100)
    assert c.p2_min_share == 0.10 and c.wait_s == (5.0, 30.0, 300.0) and c.max_wait_s == 3600.0
    assert [c.default_wait_s(p) for p in (100, 99, 0, -1)] == [5.0, 30.0, 30.0, 300.0]


@pytest.mark.parametrize("name", ["max_per_band", "max_total", "quantum_mib", "share_window"])
def test_integer_settings_accept_one_and_refuse_zero_and_bools(name: str) -> None:
    AdmissionConfig(**{name: 1})  # type: ignore[arg-type]
    for bad in (0, True, 2.0):
        with pytest.raises(InvalidInput) as e:
            AdmissionConfig(**{name: bad})  # type: ignore[arg-type]
        assert f"admission.{name}" in str(e.value)


def test_share_and_wait_bounds_are_inclusive_where_documented() -> None:
    AdmissionConfig(p2_min_share=0.0)
    AdmissionConfig(p2_min_share=1.0)
    for bad in (-0.01, 1.01):
        with pytest.raises(InvalidInput, match=r"admission\.p2_min_share"):
            AdmissionConfig(p2_min_share=bad)
    AdmissionConfig(wait_s=(3600.0, 3600.0, 3600.0))  # the maximum itself is allowed
    AdmissionConfig(wait_s=(10.0, 10.0, 10.0), max_wait_s=10.0)
    AdmissionConfig(wait_s=(0.5, 0.001, 1.0))  # any positive wait, below one second too
    for bad_w in ((0.0, 1.0, 1.0), (1.0, 1.0, 3600.5), (1.0, -1.0, 1.0)):
        with pytest.raises(InvalidInput, match=r"admission\.wait_s"):
            AdmissionConfig(wait_s=bad_w)


def test_ticketed_cost_scope_and_immutability() -> None:
    q = AdmissionQueue()
    two = a_ticket(q, "x", vram_mib=3000, gpu_count=2)
    assert two.cost == 6000 and two.priority == 10
    assert a_ticket(q, "m1", model="llama").scope == a_ticket(q, "m2", model="qwen").scope
    assert a_ticket(q, "k1", model="llama", kv=True).scope != a_ticket(q, "k2", model="qwen", kv=True).scope
    assert a_ticket(q, "k3", model="llama", kv=True).scope[4] == "llama"
    with pytest.raises(dataclasses.FrozenInstanceError):
        two.seq = 7  # type: ignore[misc]
    assert not hasattr(two, "__dict__")  # slots: no per-instance dict
    assert not hasattr(AdmissionConfig(), "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        AdmissionConfig().max_total = 1  # type: ignore[misc]


def test_next_seq_counts_from_one() -> None:
    q = AdmissionQueue()
    assert [q.next_seq(), q.next_seq(), q.next_seq()] == [1, 2, 3]


def test_share_ok_on_an_empty_window_follows_the_configured_share() -> None:
    assert AdmissionQueue(AdmissionConfig(p2_min_share=0.1)).share_ok()
    assert not AdmissionQueue(AdmissionConfig(p2_min_share=0.0)).share_ok()


def test_share_window_boundary_and_sliding() -> None:
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.25, share_window=4))
    q.record_grant(-1)  # 1 of 1 sheddable: not below 25 %
    assert not q.share_ok()
    for _ in range(3):
        q.record_grant(0)  # priority 0 is online, not sheddable
    assert not q.share_ok()  # exactly 1 of 4 = 25 %: not *less* than the share
    q.record_grant(5)  # the sheddable grant slides out of the window
    assert q.share_ok()  # 0 of 4
    q.record_grant(-5)
    assert not q.share_ok()  # 1 of 4 again (the window keeps 4)
    for _ in range(4):
        q.record_grant(1)
    assert q.share_ok()


def test_avoid_boundaries_between_bands() -> None:
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.5))
    assert q.push(a_ticket(q, "hi", prio=50), frozenset({"u50"}))
    assert q.push(a_ticket(q, "zero", prio=0), frozenset({"u0"}))
    assert q.push(a_ticket(q, "neg", prio=-1), frozenset({"u-1"}))
    assert q.avoid(50) == {"u50"}  # its own band counts
    assert q.avoid(51) == set()
    assert q.avoid(0) == {"u50", "u0"}  # priority 0 is online: no minimum share for it
    assert q.avoid(1) == {"u50"}
    # a sheddable newcomer, share not yet used: only sheddable holds (0 is online)
    assert q.share_ok() and q.avoid(-1) == {"u-1"}
    assert q.avoid(-2) == {"u-1"}
    q.record_grant(-1)  # 1 of 1 sheddable: share used up, every hold of its band or higher counts
    assert q.avoid(-1) == {"u50", "u0", "u-1"}
    assert q.avoid(-2) == {"u50", "u0", "u-1"}


def reference_order(
    fifos: dict[str, list[tuple[str, int]]],
    deficit: dict[str, int],
    quantum: int,
    blocked: set[str],
) -> list[str]:
    """Plain deficit round robin over one band, one quantum per visit, no shortcut; updates
    ``fifos`` (granted items leave) and ``deficit`` (tenants with nothing left leave)."""
    rr = deque(t for t in fifos if fifos[t])
    nxt = dict.fromkeys(fifos, 0)
    offered: list[str] = []
    while rr:
        t = rr[0]
        if nxt[t] >= len(fifos[t]):
            rr.popleft()
            continue
        ticket, cost = fifos[t][nxt[t]]
        if deficit[t] < cost:
            deficit[t] += quantum
            rr.rotate(-1)
            continue
        nxt[t] += 1
        offered.append(ticket)
        if ticket not in blocked:
            deficit[t] -= cost
    for t in list(fifos):
        fifos[t] = [x for x in fifos[t] if x[0] in blocked]
        if not fifos[t]:
            del fifos[t], deficit[t]
    return offered


def a_pool(blocked: set[str], offered: list[str]) -> TryGrant:
    """A pool that records every offer and blocks (holding nothing) the tickets in ``blocked``."""

    def pool(x: Ticketed, _: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        offered.append(x.ticket)
        return (Verdict.BLOCKED, NOTHING) if x.ticket in blocked else (Verdict.GRANTED, NOTHING)

    return pool


@pytest.mark.parametrize("seed", range(12))
def test_round_robin_order_equals_plain_deficit_round_robin(seed: int) -> None:
    rng = random.Random(seed)
    quantum = rng.choice([1000, 4096, 8192])
    q = AdmissionQueue(AdmissionConfig(quantum_mib=quantum))
    fifos: dict[str, list[tuple[str, int]]] = {}
    for i in range(rng.randint(3, 14)):
        tenant = rng.choice("abcd")
        mib = rng.choice([100, 999, 1000, 1001, 4096, 8192, 20_000, 70_000])
        gpus = rng.choice([1, 1, 2, 3])
        t = a_ticket(q, f"t{i}", tenant=tenant, vram_mib=mib, gpu_count=gpus)
        assert q.push(t)
        fifos.setdefault(tenant, []).append((t.ticket, t.cost))
    deficit = dict.fromkeys(fifos, 0)
    for n in range(3):  # deficits carry over from one pass to the next
        for j in range(rng.randint(0, 3) if n else 0):  # newcomers; a returning tenant starts at 0
            tenant = rng.choice("abcde")
            t = a_ticket(q, f"n{n}-{j}", tenant=tenant, vram_mib=rng.choice([500, 1000, 9000]))
            assert q.push(t)
            if tenant not in fifos:
                fifos[tenant], deficit[tenant] = [], 0
            fifos[tenant].append((t.ticket, t.cost))
        blocked = {x for x in q._items if rng.random() < 0.4}
        offered: list[str] = []
        granted = q.drain(a_pool(blocked, offered))
        want = reference_order(fifos, deficit, quantum, blocked)
        assert offered == want
        assert [x.ticket for x in granted] == [t for t in want if t not in blocked]
        assert sorted(x.ticket for x in q) == sorted(t for f in fifos.values() for t, _ in f)
        assert len(q) == sum(len(f) for f in fifos.values())


def test_many_removals_keep_deadlines_exact() -> None:
    q = AdmissionQueue(AdmissionConfig(max_per_band=4096))
    items = [a_ticket(q, f"t{i}", deadline=float(i)) for i in range(2000)]
    for it in items:
        assert q.push(it)
    for it in items[:1900]:
        q.remove(it.ticket)  # stale heap entries pile up and get compacted (past 4 x live + 1024)
    assert [x.ticket for x in q.expire(1950.0)] == [f"t{i}" for i in range(1900, 1951)]
    assert len(q) == 49 and q.expire(1950.0) == []
    for it in items[1951:]:
        q.remove(it.ticket)
    assert len(q) == 0 and q._bands == {} and q._order == []  # an empty band leaves the books


def test_a_new_tenant_starts_with_no_deficit() -> None:
    """quantum 1000: ``a`` needs 1001 (two quanta), ``b`` 1000 (one), so ``b`` goes first; a tenant
    starting with any credit at all would let ``a`` through in the first round."""
    q = AdmissionQueue(AdmissionConfig(quantum_mib=1000))
    assert q.push(a_ticket(q, "a1", tenant="a", vram_mib=1001))
    assert q.push(a_ticket(q, "b1", tenant="b", vram_mib=1000))
    assert [x.ticket for x in q.drain(a_pool(set(), []))] == ["b1", "a1"]


def test_a_deadline_equal_to_now_has_expired() -> None:
    q = AdmissionQueue()
    assert q.push(a_ticket(q, "a", deadline=5.0))
    assert q.expire(4.999) == []
    assert [x.ticket for x in q.expire(5.0)] == ["a"]


def test_depth_by_band_counts_each_band() -> None:
    q = AdmissionQueue()
    assert q.depth_by_band() == {"P0": 0, "P1": 0, "P2": 0}
    for t, prio in (("a", 100), ("b", 150), ("c", 0), ("d", -1)):
        assert q.push(a_ticket(q, t, prio=prio))
    assert q.depth_by_band() == {"P0": 2, "P1": 1, "P2": 1}


def test_drain_hands_each_band_the_right_holds() -> None:
    """Online bands (priority >= 0, band 0 included) see every earlier hold; sheddable items, while
    the minimum share is unused, see only the holds of earlier sheddable items."""
    q = AdmissionQueue(AdmissionConfig(p2_min_share=0.5))
    for t, prio in (("hi", 50), ("zero", 0), ("zero2", 0), ("neg", -1), ("neg2", -2)):
        assert q.push(a_ticket(q, t, prio=prio))
    holds = {"hi": {"u50"}, "zero": {"u0"}, "neg": {"u-1"}}
    seen: dict[str, frozenset[str]] = {}

    def pool(x: Ticketed, avoid: frozenset[str]) -> tuple[Verdict, frozenset[str]]:
        seen[x.ticket] = avoid
        return Verdict.BLOCKED, frozenset(holds.get(x.ticket, set()))

    assert q.share_ok() and q.drain(pool) == []
    assert seen == {
        "hi": set(),
        "zero": {"u50"},
        "zero2": {"u50", "u0"},
        "neg": set(),
        "neg2": {"u-1"},
    }
