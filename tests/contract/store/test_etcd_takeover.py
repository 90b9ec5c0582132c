"""A take-over on a real etcd, in process: the new leader's ledger is the store's, its queue too.

Two controllers on one etcd prefix, each behind its own `Election` (as two ``gpupool serve``
replicas are): the first leads, grants a whole H100 and queues a second request for it (a ticket,
stored with the lease in one Txn), then hands over. Proves: the second replica, once elected,
rebuilds the ledger from etcd (the lease active, the ticket still queued, nothing granted twice),
resumes the queue (releasing the first lease grants the ticket, and that is in etcd), and the old
leader can no longer write anything (its release fails with `NotLeader`, etcd unchanged).
"""

from __future__ import annotations

import time

import pytest

from gpupool.adapters.store.etcd import NotLeader, open_etcd_store
from gpupool.adapters.store.etcd_election import Election
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.model import Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import RevisionConflict
from gpupool.hardware.units import Resources

pytestmark = pytest.mark.etcd
H100 = "gpu-c/0"


def request(rid: str) -> Request:
    return Request(id=rid, tenant="t", priority=10, demand=Resources(81920, 1000), ttl_s=600.0)


def replica(url: str, name: str) -> tuple[Election, LeaseController]:
    store = open_etcd_store(url)
    el = Election(store, candidate=name, ttl_s=2)
    assert el.campaign(timeout_s=30), f"{name} was not elected"
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    c.recover()
    return el, c


def test_the_new_leader_rebuilds_from_etcd_resumes_the_queue_and_fences_the_old_one(etcd_url: str) -> None:
    el1, c1 = replica(etcd_url, "one")
    first = c1.acquire(request("first"), gpu_id=H100)
    assert first.code is OutcomeCode.GRANTED and first.lease is not None
    second = c1.acquire(request("second"), gpu_id=H100, wait_s=600.0)
    assert second.code is OutcomeCode.QUEUED and second.ticket
    c1.flush()  # acknowledged: the lease and the ticket are in etcd
    el1.resign()

    el2, c2 = replica(etcd_url, "two")
    assert [x.id for x in c2.leases()] == [first.lease.id]
    assert c2.ticket(str(second.ticket)).state == "queued"
    c2.release(first.lease.id)  # frees the H100: the restored ticket is granted, nothing else
    c2.flush()
    granted = c2.ticket(str(second.ticket))
    assert granted.state == "granted" and granted.lease is not None
    c2.check_invariants()

    reader = open_etcd_store(etcd_url)
    assert [x.id for x in reader.active()] == [granted.lease.id]
    stored = reader.get_ticket(str(second.ticket))
    assert stored is not None and stored.state == "granted"

    # the old leader still has its view of the ledger; whatever it tries, etcd takes none of it
    revision = reader.revision()
    with pytest.raises((NotLeader, RevisionConflict)):  # (the lease changed and the fence broke)
        c1.release(first.lease.id)  # (its queue grants the ticket too: the write goes out at once)
        c1.flush()
    small = Request(id="small", tenant="t", priority=10, demand=Resources(1024, 0), ttl_s=600.0)
    with pytest.raises(NotLeader):  # a new lease: only the fence can refuse it
        c1.acquire(small)
        c1.flush()
    assert reader.revision() == revision
    assert [x.id for x in reader.active()] == [granted.lease.id]
    el2.resign()
    for c in (c1, c2):
        c.store.close()
    reader.close()
