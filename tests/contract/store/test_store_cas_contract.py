"""Compare-and-set on revisions across writers, on every engine (memory, SQLite, etcd).

Proves: a second store object on the same data (another process, a new leader) sees the first one's
writes before its compare (a store that trusted what it last wrote would let a stale writer win);
concurrent compare-and-set increments from several writers lose no update and apply none twice; in
a batch the conflict names the first lease whose compare failed, with the revision actually stored,
and nothing of the batch lands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from gpupool.core.model import Grant, Lease, Request
from gpupool.core.ports import LeaseStore, RevisionConflict, StoreWrite, TicketRecord
from gpupool.hardware.units import Resources

Factory = Callable[[], LeaseStore]


def lease(lid: str, *, rev: int = 1) -> Lease:
    req = Request(id=f"r-{lid}", tenant="t", priority=1, demand=Resources(512, 0), ttl_s=60.0)
    return Lease(
        id=lid,
        request=req,
        node="n1",
        grants=(Grant("n1/0/a", "n1/0", Resources(512, 0)),),
        granted_at=1.0,
        expires_at=61.0,
        revision=rev,
    )


def test_a_second_writer_sees_the_first_ones_writes_before_comparing(make_store: Factory) -> None:
    a, b = make_store(), make_store()
    a.apply([StoreWrite(lease("x"), None)])
    b.apply([StoreWrite(lease("x", rev=2), 1)])  # b never wrote x: it must read what a wrote
    with pytest.raises(RevisionConflict) as e:
        a.apply([StoreWrite(lease("x", rev=2), 1)])  # a's own last write is stale now
    assert (e.value.lease_id, e.value.expected, e.value.actual) == ("x", 1, 2)
    a.apply([StoreWrite(lease("x", rev=3), 2)])  # after the conflict a knows revision 2
    assert b.get("x") == lease("x", rev=3)
    with pytest.raises(RevisionConflict) as e:
        b.apply([StoreWrite(lease("x"), None)])  # create of an existing id
    assert e.value.actual == 3


def test_the_conflict_names_the_first_failing_lease_and_nothing_of_the_batch_lands(
    make_store: Factory,
) -> None:
    s = make_store()
    s.apply([StoreWrite(lease("a"), None), StoreWrite(lease("b"), None)])
    t = TicketRecord("t1", "queued", lease("a").request, 1.0, 2.0)
    with pytest.raises(RevisionConflict) as e:
        s.apply([StoreWrite(lease("a", rev=2), 1), t, StoreWrite(lease("b", rev=6), 5)])
    assert (e.value.lease_id, e.value.expected, e.value.actual) == ("b", 5, 1)
    assert s.get("a") == lease("a") and s.get_ticket("t1") is None
    with pytest.raises(RevisionConflict) as e:  # a chain inside one batch is checked in order
        s.apply([StoreWrite(lease("a", rev=2), 1), StoreWrite(lease("a", rev=4), 3)])
    assert (e.value.expected, e.value.actual) == (3, 2)
    assert s.get("a") == lease("a")
    s.apply([StoreWrite(lease("a", rev=2), 1), StoreWrite(lease("a", rev=3), 2)])
    assert s.get("a") == lease("a", rev=3)


@pytest.mark.parametrize(
    "make_store", ["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)], indirect=True
)
def test_concurrent_writers_lose_no_update(make_store: Factory) -> None:
    """4 writers (own store objects) each try 15 read-then-compare-and-set increments of one lease."""
    first = make_store()
    first.apply([StoreWrite(lease("c"), None)])
    stores = [make_store() for _ in range(4)]
    wins = [0] * len(stores)
    conflicts = [0] * len(stores)

    def work(i: int) -> None:
        s = stores[i]
        for _ in range(15):
            cur = s.get("c")
            assert cur is not None
            try:
                s.apply([StoreWrite(lease("c", rev=cur.revision + 1), cur.revision)])
                wins[i] += 1
            except RevisionConflict:
                conflicts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = first.get("c")
    assert final is not None
    assert final.revision == 1 + sum(wins)  # every win is one increment: none lost, none doubled
    assert sum(wins) + sum(conflicts) == 60
