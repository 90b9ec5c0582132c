"""The batch-job queue on both durable engines: SQLite (``BatchJobQueue``) and etcd (``EtcdJobQueue``).

Proves, for each: queue order (deadline, submission, id), duplicate and unknown ids named, the state
machine (a refused move changes nothing), claim as a compare-and-set (one winner among several
queue objects on the same data, as among replicas), and that a reopened queue (a new process or a
new leader) has every job and requeues the RUNNING/PAUSED ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.core import DuplicateId, InvalidInput, UnknownId
from gpupool.core.tidal.jobs import BatchJobSpec, JobState

Opener = Callable[[], Any]


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def open_queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[Any] = []  # (only what the test's own thread opened: a thread closes its own)

    def make() -> Any:
        mine = threading.current_thread() is threading.main_thread()
        if request.param == "sqlite":
            from gpupool.adapters.batch.queue import BatchJobQueue

            q: Any = BatchJobQueue(tmp_path / "jobs.db")
            if mine:
                opened.append(q)
        else:
            from gpupool.adapters.store.etcd import open_etcd_store
            from gpupool.adapters.store.etcd_jobs import EtcdJobQueue

            store = open_etcd_store(url)
            if mine:
                opened.append(store)
            q = EtcdJobQueue(store)
        return q

    url = request.getfixturevalue("etcd_url") if request.param == "etcd" else ""
    yield make
    for q in opened:
        q.close()


def job(i: str, **kw: Any) -> BatchJobSpec:
    kw.setdefault("command", ("true",))
    return BatchJobSpec(id=i, vram_mib=kw.pop("vram_mib", 1024), **kw)


def test_queue_order_and_ids(open_queue: Opener) -> None:
    q = open_queue()
    q.submit(job("late", deadline_s=2000.0), now=1.0)
    q.submit(job("none-b"), now=2.0)
    q.submit(job("none-a"), now=2.0)
    q.submit(job("early", deadline_s=1000.0), now=3.0)
    assert [r.spec.id for r in q.jobs(JobState.QUEUED)] == ["early", "late", "none-a", "none-b"]
    with pytest.raises(DuplicateId):
        q.submit(job("early"), now=4.0)
    with pytest.raises(UnknownId):
        q.get("nope")
    with pytest.raises(InvalidInput):
        q.submit(job("bad", vram_mib=0), now=4.0)
    assert len(q.jobs()) == 4


def test_state_machine_claim_and_recovery_in_a_new_process(open_queue: Opener) -> None:
    q = open_queue()
    q.submit(job("a", checkpointable=True, tokens=100, args=("x",)), now=1.0)
    q.submit(job("b"), now=2.0)
    got = q.claim("a", worker="w", now=3.0, lease_id="L1")
    assert got is not None and got.state is JobState.RUNNING and got.attempts == 1
    assert q.claim("a", worker="w2", now=3.0, lease_id="L2") is None
    q.transition("a", JobState.PAUSED, now=4.0, reason="lease preempted")
    with pytest.raises(InvalidInput):
        q.transition("b", JobState.DONE, now=4.0)
    assert q.get("b").state is JobState.QUEUED
    q2 = open_queue()
    a = q2.get("a")
    assert (
        a.state is JobState.PAUSED and a.spec.tokens == 100 and a.spec.args == ("x",) and a.lease_id == "L1"
    )
    assert q2.recover(now=5.0) == ["a"]
    rec = q2.get("a")
    assert (
        rec.state is JobState.QUEUED and rec.attempts == 1 and "requeued" in rec.reason and rec.lease_id == ""
    )
    assert q2.claim("a", worker="w3", now=6.0, lease_id="L3") is not None
    done = q2.transition("a", JobState.DONE, now=7.0, returncode=0, reason="exit 0")
    assert done.returncode == 0 and q.get("a") == done


def test_one_claim_wins_among_replicas(open_queue: Opener) -> None:
    first = open_queue()
    first.submit(job("j"), now=1.0)
    n = 4
    wins: list[str] = []
    barrier = threading.Barrier(n)

    def claim(i: int) -> None:
        q = open_queue()  # each replica its own queue object (SQLite: its own connection)
        barrier.wait()
        if q.claim("j", worker=f"w{i}", now=2.0, lease_id=f"L{i}") is not None:
            wins.append(f"w{i}")
        q.close()
        getattr(q, "store", q).close()  # (etcd: the queue's store and its client)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    rec = first.get("j")
    assert rec.worker == wins[0] and rec.attempts == 1


def _damage(q: Any, job_id: str) -> None:
    """Overwrite a job's stored value with text that is not a job (damage on disk, a hand edit)."""
    from gpupool.adapters.batch.queue import BatchJobQueue

    if isinstance(q, BatchJobQueue):
        q._db.execute("UPDATE batch_jobs SET spec = '{broken' WHERE id = ?", (job_id,))
    else:
        q.client.put(q._key(job_id), b"{broken")


def test_a_damaged_job_is_named_and_can_be_skipped(open_queue: Opener) -> None:
    """Reading a damaged job is `StoreDamaged` naming it (etcd raised json's own error: a 500);
    ``jobs(damaged=...)`` skips it and names it there, and recovery requeues the others."""
    from gpupool.core.errors import StoreDamaged

    q = open_queue()
    q.submit(job("bad", deadline_s=1.0), now=1.0)
    q.submit(job("ok"), now=2.0)
    q.submit(job("run"), now=3.0)
    assert q.claim("run", worker="w", now=4.0, lease_id="L1") is not None
    _damage(q, "bad")
    for read in (q.jobs, lambda: q.jobs(JobState.QUEUED), lambda: q.get("bad")):
        with pytest.raises(StoreDamaged, match="'bad'"):
            read()
    damaged: dict[str, str] = {}
    assert [r.spec.id for r in q.jobs(JobState.QUEUED, damaged=damaged)] == ["ok"]
    assert list(damaged) == ["bad"] and "'bad'" in damaged["bad"]
    assert open_queue().recover(now=5.0) == ["run"]
    assert q.get("run").state is JobState.QUEUED
