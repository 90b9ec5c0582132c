"""One contract suite over every `LeaseStore` implementation (memory = reference, SQLite and etcd v3 =
durable; the engines and the etcd server are in `conftest.py`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.adapters.store import MemoryLeaseStore, SqliteLeaseStore, open_store
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.ports import LeaseStore, RevisionConflict, StoreWrite, decode_lease, encode_lease
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import Resources


def lease(lid: str, *, tenant: str = "t1", rev: int = 1, state: LeaseState = LeaseState.ACTIVE) -> Lease:
    req = Request(
        id=f"r-{lid}",
        tenant=tenant,
        priority=-1,
        demand=Resources(1024, 100),
        ttl_s=30.5,
        kinds=frozenset({SliceKind.MPS, SliceKind.MIG}),
        nodes=frozenset({"n1"}),
        model="m",
        labels=(("k", "v"),),
    )
    return Lease(
        id=lid,
        request=req,
        node="n1",
        grants=(Grant("n1/0/a", "n1/0", Resources(1024, 100)),),
        granted_at=1.0 / 3.0,
        expires_at=1e9 + 0.125,
        state=state,
        revision=rev,
        ended_at=None if state is LeaseState.ACTIVE else 5.0,
    )


Factory = Callable[[], LeaseStore]


def test_codec_round_trips_exactly() -> None:
    x = lease("a")
    assert decode_lease(encode_lease(x)) == x
    y = x.with_state(LeaseState.RELEASED, at=7.25, reason="done")
    assert decode_lease(encode_lease(y)) == y


def test_create_get_and_list_sorted(make_store: Factory) -> None:
    s = make_store()
    s.apply([StoreWrite(lease("b"), None), StoreWrite(lease("a", tenant="t2"), None)])
    assert s.get("a") == lease("a", tenant="t2")
    assert s.get("zzz") is None
    assert [x.id for x in s.active()] == ["a", "b"]
    assert [x.id for x in s.leases(tenant="t1")] == ["b"]


def test_create_of_existing_id_conflicts(make_store: Factory) -> None:
    s = make_store()
    s.apply([StoreWrite(lease("a"), None)])
    with pytest.raises(RevisionConflict) as e:
        s.apply([StoreWrite(lease("a"), None)])
    assert e.value.actual == 1


def test_compare_and_set_on_revision(make_store: Factory) -> None:
    s = make_store()
    a = lease("a")
    s.apply([StoreWrite(a, None)])
    a2 = a.renewed(2e9)
    s.apply([StoreWrite(a2, 1)])
    assert s.get("a") == a2
    with pytest.raises(RevisionConflict) as e:
        s.apply([StoreWrite(a2.renewed(3e9), 1)])
    assert (e.value.expected, e.value.actual) == (1, 2)
    with pytest.raises(RevisionConflict):
        s.apply([StoreWrite(lease("nope", rev=2), 1)])
    assert s.get("a") == a2


def test_batch_is_atomic(make_store: Factory) -> None:
    s = make_store()
    s.apply([StoreWrite(lease("a"), None)])
    with pytest.raises(RevisionConflict):
        s.apply([StoreWrite(lease("b"), None), StoreWrite(lease("a", rev=2), 5)])
    assert s.get("b") is None
    assert s.get("a") == lease("a")


def test_batch_applies_in_order(make_store: Factory) -> None:
    s = make_store()
    a = lease("a")
    ended = a.with_state(LeaseState.RELEASED, at=9.0)
    s.apply([StoreWrite(a, None), StoreWrite(ended, 1)])
    assert s.get("a") == ended
    assert s.active() == []


def test_purge_only_old_ended(make_store: Factory) -> None:
    s = make_store()
    a, b = lease("a"), lease("b")
    s.apply([StoreWrite(a, None), StoreWrite(b, None)])
    s.apply([StoreWrite(b.with_state(LeaseState.EXPIRED, at=10.0), 1)])
    assert s.purge_ended(before_s=10.0) == 0
    assert s.purge_ended(before_s=11.0) == 1
    assert [x.id for x in s.leases()] == ["a"]


def test_meta(make_store: Factory) -> None:
    s = make_store()
    assert s.get_meta("k") is None
    s.set_meta("k", "1")
    s.set_meta("k", "2")
    assert s.get_meta("k") == "2"


def test_sqlite_survives_reopen_and_two_writers_compare_and_set(tmp_path: Path) -> None:
    p = tmp_path / "x.db"
    s1 = SqliteLeaseStore(p)
    s1.apply([StoreWrite(lease("a"), None)])
    s1.close()
    s2, s3 = SqliteLeaseStore(p), open_store(f"sqlite:{p}")
    assert s2.get("a") == lease("a")
    s2.apply([StoreWrite(lease("a", rev=2), 1)])
    with pytest.raises(RevisionConflict):
        s3.apply([StoreWrite(lease("a", rev=2), 1)])
    s2.close()
    s3.close()


def test_open_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store("memory:"), MemoryLeaseStore)
    s = open_store(str(tmp_path / "y.db"))
    assert isinstance(s, SqliteLeaseStore)
    s.close()
