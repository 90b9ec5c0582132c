"""`Follower` on a real etcd: a standby's read-only view of the ledger, kept current by watch.

Proves: the view starts from the store's state (leases, tickets, leader key) and follows every later
change in order (a new lease, a new revision of it, a deleted one); the leader key's changes are
reported (a delete as None, so a standby campaigns at once); after etcd itself is killed and
restarted the view catches up with what was written meanwhile; the follower never writes (the
store's commit count and etcd's revision do not move because of it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from gpupool.adapters.store.etcd import open_etcd_store
from gpupool.adapters.store.etcd_election import Election
from gpupool.adapters.store.etcd_follower import Follower
from gpupool.adapters.store.etcd_server import LocalEtcd
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.ports import StoreWrite
from gpupool.hardware.units import Resources

pytestmark = pytest.mark.etcd


def lease(i: int, rev: int = 1, tenant: str = "t") -> Lease:
    req = Request(id=f"r{i}", tenant=tenant, priority=1, demand=Resources(100, 0), ttl_s=60.0)
    return Lease(
        id=f"L{i}",
        request=req,
        node="n",
        grants=(Grant("n/0/a", "n/0", Resources(100, 0)),),
        granted_at=0.0,
        expires_at=1e12,
        revision=rev,
    )


def until(what: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "the view did not catch up"
        time.sleep(0.02)


def test_the_view_starts_from_the_store_and_follows_every_change(etcd_url: str) -> None:
    writer = open_etcd_store(etcd_url)
    writer.apply([StoreWrite(lease(1), None)])
    reader = open_etcd_store(etcd_url)
    leaders: list[str | None] = []
    f = Follower(reader, on_leader=leaders.append).start()
    try:
        assert [x.id for x in f.leases()] == ["L1"] and f.leader() is None
        rev_before = reader.revision()
        writer.apply([StoreWrite(lease(2, tenant="u"), None), StoreWrite(lease(1, 2), 1)])
        until(lambda: f.get("L2") is not None and f.get("L1") is not None and f.get("L1").revision == 2)  # type: ignore[union-attr]
        assert [x.id for x in f.leases(tenant="u")] == ["L2"]
        ended = lease(2, 2, tenant="u").with_state(LeaseState.RELEASED, at=1.0, reason="done")
        writer.apply([StoreWrite(ended, 1)])
        until(lambda: f.get("L2") is not None and f.get("L2").state is LeaseState.RELEASED)  # type: ignore[union-attr]
        assert writer.purge_ended(before_s=10.0) == 1
        until(lambda: f.get("L2") is None)
        el = Election(writer, candidate="http://leader:1#x", ttl_s=2)
        assert el.try_acquire()
        until(lambda: f.leader() == "http://leader:1#x")
        el.resign()
        until(lambda: f.leader() is None)
        assert leaders == ["http://leader:1#x", None]
        assert reader.commits == 0 and rev_before < reader.revision()  # (the writer's, not the view's)
    finally:
        f.close()
        writer.close()
        reader.close()


@pytest.mark.slow
def test_the_view_catches_up_after_etcd_restarts(tmp_path: pytest.TempPathFactory) -> None:
    etcd = LocalEtcd().start()
    try:
        url = f"etcd://{etcd.endpoint}/follow/"
        writer = open_etcd_store(url)
        reader = open_etcd_store(url)
        f = Follower(reader, retry_s=0.1).start()
        writer.apply([StoreWrite(lease(1), None)])
        until(lambda: f.get("L1") is not None)
        etcd.kill()
        time.sleep(0.5)
        etcd.start()
        writer.apply([StoreWrite(lease(2), None)])
        until(lambda: f.get("L2") is not None, timeout_s=60)
        assert sorted(x.id for x in f.leases()) == ["L1", "L2"]
        f.close()
        assert not any(t.name == "gpupool-follower-resync" and t.is_alive() for t in threading.enumerate())
        writer.close()
        reader.close()
    finally:
        etcd.stop()


def test_the_view_follows_meta_keys_such_as_the_leaders_device_states(etcd_url: str) -> None:
    writer = open_etcd_store(etcd_url)
    writer.set_meta("device_states", '{"n": {"L1": "granted-pending-free"}}')
    reader = open_etcd_store(etcd_url)
    f = Follower(reader).start()
    try:
        assert f.meta("device_states") == '{"n": {"L1": "granted-pending-free"}}'  # (from the snapshot)
        assert f.meta("watermarks") is None
        writer.set_meta("device_states", "{}")
        until(lambda: f.meta("device_states") == "{}")  # (from the watch)
    finally:
        f.close()
        reader.close()
        writer.close()
