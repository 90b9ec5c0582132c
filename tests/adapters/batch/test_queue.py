"""Durable batch queue on real SQLite files, and the core job spec rules."""

from __future__ import annotations

import re

import pytest

from gpupool.adapters.batch.queue import BatchJobQueue
from gpupool.core import DuplicateId, InvalidInput, UnknownId
from gpupool.core.errors import StoreRefused
from gpupool.core.tidal.jobs import BatchJobSpec, JobState, lease_request, queue_key, validate_job


def job(i: str, **kw) -> BatchJobSpec:
    kw.setdefault("command", ("true",))
    return BatchJobSpec(id=i, vram_mib=kw.pop("vram_mib", 1024), **kw)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (BatchJobSpec(id="", vram_mib=1, command=("true",)), "id"),
        (BatchJobSpec(id="a", vram_mib=1), "command"),
        (BatchJobSpec(id="a", vram_mib=1, command=("x",), ray_task="m:f"), "command"),
        (BatchJobSpec(id="a", vram_mib=1, ray_task="nocolon"), "ray_task"),
        (BatchJobSpec(id="a", vram_mib=0, command=("x",)), "vram_mib"),
        (BatchJobSpec(id="a", vram_mib=10**20, command=("x",)), "vram_mib"),
        (BatchJobSpec(id="a", vram_mib=1, command=("x",), tenant=""), "tenant"),
        (BatchJobSpec(id="a", vram_mib=1, command=("x",), tenant="t" * 201), "tenant"),
        (BatchJobSpec(id="a", vram_mib=1, command=("x",), compute_milli=1001), "compute_milli"),
        (BatchJobSpec(id="a", vram_mib=1, command=("x",), deadline_s=float("inf")), "deadline_s"),
        (BatchJobSpec(id="a", vram_mib=1, command=("python3", "-c", "pass\x00")), "command"),  # argv: no NUL
    ],
)
def test_bad_specs_name_the_field(spec, field):
    with pytest.raises(InvalidInput) as e:
        validate_job(spec)
    assert e.value.field == field


def test_queue_order_is_edf_then_submission_then_id(tmp_path):
    q = BatchJobQueue(tmp_path / "jobs.db")
    q.submit(job("late", deadline_s=2000.0), now=1.0)
    q.submit(job("none-b"), now=2.0)
    q.submit(job("none-a"), now=2.0)
    q.submit(job("early", deadline_s=1000.0), now=3.0)
    assert [r.spec.id for r in q.jobs(JobState.QUEUED)] == ["early", "late", "none-a", "none-b"]
    keys = sorted(queue_key(r.spec, r.submitted_at) for r in q.jobs())
    assert [k[2] for k in keys] == ["early", "late", "none-a", "none-b"]
    with pytest.raises(DuplicateId):
        q.submit(job("early"), now=4.0)
    with pytest.raises(UnknownId):
        q.get("nope")


def test_state_machine_and_durability_across_restart(tmp_path):
    path = tmp_path / "jobs.db"
    q = BatchJobQueue(path)
    q.submit(job("a", checkpointable=True, tokens=100), now=1.0)
    q.submit(job("b"), now=2.0)
    assert q.claim("a", worker="w", now=3.0, lease_id="L1") is not None
    assert q.claim("a", worker="w2", now=3.0, lease_id="L2") is None  # compare-and-set
    q.transition("a", JobState.PAUSED, now=4.0, reason="lease preempted")
    with pytest.raises(InvalidInput):
        q.transition("b", JobState.DONE, now=4.0)  # queued -> done is not allowed
    assert q.get("b").state is JobState.QUEUED  # unchanged
    q.close()
    q2 = BatchJobQueue(path)  # a new process: nothing lost, the paused job is requeued
    assert q2.get("a").state is JobState.PAUSED and q2.get("a").spec.tokens == 100
    assert q2.recover(now=5.0) == ["a"]
    rec = q2.get("a")
    assert rec.state is JobState.QUEUED and rec.attempts == 1 and "requeued" in rec.reason


def test_lease_request_is_p2_and_preemptible():
    r = lease_request(job("x", vram_mib=2048, compute_milli=250), attempt=3, ttl_s=30.0)
    assert r.priority < 0 and r.is_preemptible and r.id == "job/x/3"
    assert r.demand.vram_mib == 2048 and r.demand.compute_milli == 250


def _fill(q: BatchJobQueue) -> None:
    """Cap the database at its current size: SQLite then answers every growing write "database or
    disk is full" (SQLITE_FULL), as on a full disk."""
    pages = q._db.execute("PRAGMA page_count").fetchone()[0]
    q._db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_refuses_writes_as_store_refused_and_changes_nothing(tmp_path):
    q = BatchJobQueue(tmp_path / "jobs.db")
    q.submit(job("a"), now=1.0)
    _fill(q)
    big = "x" * 20_000  # a row larger than the free room of the last page
    with pytest.raises(StoreRefused, match="batch queue: submit b: database or disk is full"):
        q.submit(job("b", command=("echo", big)), now=2.0)
    with pytest.raises(StoreRefused, match="move a to cancelled"):
        q.transition("a", JobState.CANCELLED, now=3.0, reason=big)
    assert [(r.spec.id, r.state) for r in q.jobs()] == [("a", JobState.QUEUED)]
    assert q.claim("a", worker="w", now=4.0, lease_id="L1") is not None  # a write that fits still goes


def test_a_queue_that_cannot_be_opened_is_store_refused_naming_the_file(tmp_path):
    (tmp_path / "batch.db").mkdir()
    with pytest.raises(StoreRefused, match=re.escape(f"batch queue: open {tmp_path / 'batch.db'}: ")):
        BatchJobQueue(tmp_path / "batch.db")
