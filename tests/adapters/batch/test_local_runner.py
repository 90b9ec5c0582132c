"""The batch runner on real subprocesses and the real core allocator: leases, pause, requeue."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from gpupool.adapters.batch.local import LocalExecutor, wait_for
from gpupool.adapters.batch.queue import BatchJobQueue
from gpupool.adapters.batch.runner import BatchRunner
from gpupool.core import P0, Allocator, ManualClock, Request, Resources, Slice, SliceKind
from gpupool.core.errors import StoreRefused
from gpupool.core.tidal.jobs import BatchJobSpec, JobState

GPU = Slice(id="gpu-0", node="n0", gpu_id="gpu-0", kind=SliceKind.WHOLE, capacity=Resources(10_000, 1000))


def proc_state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


def setup(tmp_path):
    clock = ManualClock(0.0)
    alloc = Allocator([GPU], clock=clock)
    q = BatchJobQueue(tmp_path / "jobs.db")
    return clock, alloc, q, BatchRunner(q, alloc, LocalExecutor(), lease_ttl_s=3600.0)


def sleeper(i: str, *, checkpointable: bool, vram: int = 6000) -> BatchJobSpec:
    return BatchJobSpec(
        id=i, vram_mib=vram, command=(sys.executable, "-c", "import time; time.sleep(60)"),
        checkpointable=checkpointable,
    )  # fmt: skip


def p0(rid: str, vram: int = 8000) -> Request:
    return Request(id=rid, tenant="online", priority=P0, demand=Resources(vram, 0), ttl_s=600.0)


def test_jobs_run_to_done_and_failed_with_leases(tmp_path):
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(BatchJobSpec(id="ok", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=0.0)
    q.submit(
        BatchJobSpec(id="bad", vram_mib=1000, command=(sys.executable, "-c", "raise SystemExit(3)")), now=0.0
    )
    runner.step(clock.now())
    assert set(runner.running) == {"ok", "bad"}
    assert alloc.slice_state("gpu-0").granted.vram_mib == 2000  # each running job holds a P2 lease
    assert wait_for(lambda: all(r.handle.poll() is not None for r in runner.running.values()))
    runner.step(clock.advance(1.0))
    assert q.get("ok").state is JobState.DONE and q.get("bad").state is JobState.FAILED
    assert q.get("bad").returncode == 3
    assert alloc.slice_state("gpu-0").granted.vram_mib == 0
    alloc.check_invariants()


def test_p0_preempts_a_checkpointable_job_which_pauses_then_resumes(tmp_path):
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(sleeper("ckpt", checkpointable=True), now=0.0)
    runner.step(clock.now())
    pid = runner.running["ckpt"].handle.proc.pid  # type: ignore[attr-defined]
    out = alloc.allocate(p0("agent-1"), preempt=True)  # needs 8000 of 10000: the P2 lease must go
    assert out.granted and [v.request.id for v in out.victims] == ["job/ckpt/1"]
    runner.step(clock.advance(1.0))
    assert q.get("ckpt").state is JobState.PAUSED
    assert wait_for(lambda: proc_state(pid) == "T")  # SIGSTOPped, progress kept
    runner.step(clock.advance(1.0))
    assert q.get("ckpt").state is JobState.PAUSED  # no room while P0 holds the GPU
    alloc.release(out.lease.id)
    runner.step(clock.advance(1.0))
    assert q.get("ckpt").state is JobState.RUNNING and q.get("ckpt").attempts == 1
    assert wait_for(lambda: proc_state(pid) in ("S", "R"))
    runner.running["ckpt"].handle.stop()
    alloc.check_invariants()


def test_non_checkpointable_job_is_requeued_never_dropped(tmp_path):
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(sleeper("plain", checkpointable=False), now=0.0)
    runner.step(clock.now())
    handle = runner.running["plain"].handle
    out = alloc.allocate(p0("agent-2"), preempt=True)
    assert out.granted and len(out.victims) == 1
    runner.step(clock.advance(1.0))
    assert handle.poll() is not None  # stopped
    rec = q.get("plain")
    assert rec.state is JobState.QUEUED and "requeued" in rec.reason
    alloc.release(out.lease.id)
    runner.step(clock.advance(1.0))
    assert q.get("plain").state is JobState.RUNNING and q.get("plain").attempts == 2
    runner.running["plain"].handle.stop()
    events = [e[2] for e in runner.log]
    assert events == ["started", "requeued", "started"]


class RefusingQueue(BatchJobQueue):
    """A queue whose writes are refused from now on (a runner stepping down: another replica leads)."""

    refuse = False

    def set_state(self, job_id, new, **kw):  # (`transition` writes through it too)
        if self.refuse:
            raise RuntimeError(f"refused: {job_id} -> {new.value}")
        return super().set_state(job_id, new, **kw)


def test_stop_all_stops_every_process_even_when_the_writes_are_refused(tmp_path):
    clock = ManualClock(0.0)
    alloc = Allocator([GPU], clock=clock)
    q = RefusingQueue(tmp_path / "jobs.db")
    runner = BatchRunner(q, alloc, LocalExecutor(), lease_ttl_s=3600.0)
    for i in ("a", "b"):
        q.submit(sleeper(i, checkpointable=False, vram=1000), now=0.0)
    runner.step(clock.now())
    handles = [r.handle for r in runner.running.values()]
    assert len(handles) == 2
    q.refuse = True
    try:
        runner.stop_all(now=1.0)
    except RuntimeError as exc:
        assert "refused" in str(exc)
    else:
        raise AssertionError("the refused write was not reported")
    assert all(h.poll() is not None for h in handles)  # both stopped, not only the first
    assert runner.running == {} and runner.paused == {}


def test_a_job_dies_with_the_process_that_started_it(tmp_path):
    """PR_SET_PDEATHSIG: a gateway killed with SIGKILL leaves no job running unowned."""
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "job.pid"
    job = tmp_path / "job.py"
    job.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    starter = (
        "import sys, time\n"
        "from gpupool.adapters.batch.local import LocalExecutor\n"
        "from gpupool.core.tidal.jobs import BatchJobSpec\n"
        f"spec = BatchJobSpec(id='j', vram_mib=1, command=(sys.executable, {str(job)!r}))\n"
        "LocalExecutor().start(spec, lease_id='L')\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], env={**os.environ})
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30.0)
        child = int(pid_file.read_text())
        assert proc_state(child) != "Z"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def gone() -> bool:
        try:
            return proc_state(child) == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10
    while not gone():
        assert time.monotonic() < deadline, "the job outlived the process that started it"
        time.sleep(0.02)


def test_a_stored_job_no_lease_can_carry_fails_and_the_queue_goes_on(tmp_path):
    """A job stored before submission checked its size (written straight into the queue here) must
    not stop every later job at each step: it fails with the reason and the next job starts."""
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(BatchJobSpec(id="huge", vram_mib=1000, command=("true",)), now=0.0)
    spec = q._db.execute("SELECT spec FROM batch_jobs WHERE id = 'huge'").fetchone()[0]
    q._db.execute("UPDATE batch_jobs SET spec = ? WHERE id = 'huge'", (spec.replace("1000", str(10**20)),))
    q.submit(BatchJobSpec(id="ok", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=1.0)
    runner.step(clock.now())
    assert q.get("huge").state is JobState.FAILED and "demand.vram_mib" in q.get("huge").reason
    assert set(runner.running) == {"ok"}
    assert wait_for(lambda: runner.running["ok"].handle.poll() is not None)
    runner.step(clock.advance(1.0))
    assert q.get("ok").state is JobState.DONE
    alloc.check_invariants()


def test_a_queue_that_refuses_writes_keeps_jobs_and_leases_consistent(tmp_path):
    """The queue's database refuses writes (SQLite's query_only: every write is refused as on a
    full or read-only disk): a start it cannot record keeps no lease; an exit it cannot record
    is reaped again at the next step, with its lease held until then."""
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(BatchJobSpec(id="quick", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=0.0)
    q._db.execute("PRAGMA query_only = 1")
    with pytest.raises(StoreRefused, match="claim quick"):
        runner.step(clock.now())
    assert not runner.running and q.get("quick").state is JobState.QUEUED
    assert alloc.slice_state("gpu-0").granted.vram_mib == 0  # the lease of the unrecorded start is gone
    q._db.execute("PRAGMA query_only = 0")
    runner.step(clock.advance(1.0))
    assert wait_for(lambda: runner.running["quick"].handle.poll() is not None)
    q._db.execute("PRAGMA query_only = 1")
    with pytest.raises(StoreRefused, match="move quick to done"):
        runner.step(clock.advance(1.0))
    assert q.get("quick").state is JobState.RUNNING and "quick" in runner.running
    assert alloc.slice_state("gpu-0").granted.vram_mib == 1000  # held until the exit is recorded
    q._db.execute("PRAGMA query_only = 0")
    runner.step(clock.advance(1.0))
    assert q.get("quick").state is JobState.DONE and q.get("quick").returncode == 0
    assert not runner.running and alloc.slice_state("gpu-0").granted.vram_mib == 0
    alloc.check_invariants()


def test_a_job_whose_command_cannot_start_fails_and_the_queue_goes_on(tmp_path):
    """A command that is not there (a typo) cannot be started: the job fails with the reason, its
    lease is released at once, and the same step goes on to start the next job (it was left
    RUNNING with no process and the step raised, so the jobs after it waited for the next one)."""
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(BatchJobSpec(id="typo", vram_mib=1000, command=(str(tmp_path / "no-such-program"),)), now=0.0)
    q.submit(BatchJobSpec(id="ok", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=1.0)
    runner.step(clock.now())
    rec = q.get("typo")
    assert rec.state is JobState.FAILED and "cannot start" in rec.reason and "no-such-program" in rec.reason
    assert set(runner.running) == {"ok"}
    assert alloc.slice_state("gpu-0").granted.vram_mib == 1000  # only the job that runs holds a lease
    assert wait_for(lambda: runner.running["ok"].handle.poll() is not None)
    runner.step(clock.advance(1.0))
    assert q.get("ok").state is JobState.DONE
    assert alloc.slice_state("gpu-0").granted.vram_mib == 0
    alloc.check_invariants()


def test_a_queued_job_says_why_it_does_not_start(tmp_path):
    """A job no slice can ever hold, or one waiting for room, is listed with the reason (it waited in
    silence before); a job that starts has none."""
    from gpupool.adapters.batch.service import BatchService

    clock, _alloc, q, runner = setup(tmp_path)
    service = BatchService(q, runner, now=clock.now)
    q.submit(sleeper("fits", checkpointable=False, vram=6000), now=0.0)
    q.submit(sleeper("later", checkpointable=False, vram=6000), now=0.0)
    q.submit(sleeper("huge", checkpointable=False, vram=1_000_000), now=0.0)
    try:
        runner.step(clock.now())
        jobs = {j["id"]: j for j in service.jobs()}
        assert jobs["fits"]["state"] == "running" and jobs["fits"]["waiting"] is None
        assert jobs["later"]["state"] == "queued" and jobs["later"]["waiting"].startswith("no_capacity")
        huge = service.job("huge")
        assert huge["state"] == "queued" and huge["waiting"].startswith("unresolvable: ")
        assert "1000000" in huge["waiting"]
    finally:
        runner.stop_all(now=clock.now())


STUBBORN = (
    "import os, signal, sys, time\n"
    "ready, term, go = sys.argv[1:4]\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(term, 'w').close())\n"
    "open(ready, 'w').close()\n"
    "while not os.path.exists(go):\n"
    "    time.sleep(0.01)\n"
)


def stubborn(i: str, tmp_path: Path, *, vram: int = 6000) -> tuple[BatchJobSpec, Path, Path, Path]:
    """A job that ignores SIGTERM (it only notes it in ``term``) and exits once ``go`` exists."""
    ready, term, go = (tmp_path / f"{i}.{n}" for n in ("ready", "term", "go"))
    cmd = (sys.executable, "-c", STUBBORN, str(ready), str(term), str(go))
    return BatchJobSpec(id=i, vram_mib=vram, command=cmd), ready, term, go


def test_cancel_returns_while_a_job_that_ignores_sigterm_is_still_stopping(tmp_path):
    """Cancel waited for the process (SIGTERM, then up to the grace period) on the caller's thread,
    the gateway's event loop; it now sends SIGTERM and returns. The lease is held until the
    process is gone (SIGKILL after the grace period, off the caller's thread)."""
    clock, alloc, q, _ = setup(tmp_path)
    runner = BatchRunner(q, alloc, LocalExecutor(), lease_ttl_s=3600.0, stop_grace_s=60.0)
    spec, ready, term, go = stubborn("s", tmp_path)
    q.submit(spec, now=0.0)
    runner.step(clock.now())
    handle = runner.running["s"].handle
    assert wait_for(ready.exists)
    assert runner.cancel("s", now=clock.advance(1.0)).state is JobState.CANCELLED
    assert wait_for(term.exists)  # SIGTERM was sent ...
    assert handle.poll() is None  # ... and cancel returned while the process still runs
    assert alloc.slice_state("gpu-0").granted.vram_mib == 6000  # its lease is held meanwhile
    runner.step(clock.advance(1.0))
    assert alloc.slice_state("gpu-0").granted.vram_mib == 6000
    go.touch()
    assert wait_for(lambda: handle.poll() is not None)
    runner.step(clock.advance(1.0))
    assert alloc.slice_state("gpu-0").granted.vram_mib == 0  # released once the process is gone
    assert q.get("s").state is JobState.CANCELLED
    alloc.check_invariants()


def test_a_preempted_job_that_ignores_sigterm_is_not_waited_for_nor_started_twice(tmp_path):
    """The requeue of a preempted job sends SIGTERM and goes on; the job is queued again but not
    started while its previous process is still there (two copies of one job never run)."""
    clock, alloc, q, _ = setup(tmp_path)
    runner = BatchRunner(q, alloc, LocalExecutor(), lease_ttl_s=3600.0, stop_grace_s=60.0)
    spec, ready, term, go = stubborn("s", tmp_path, vram=1000)
    q.submit(spec, now=0.0)
    runner.step(clock.now())
    handle = runner.running["s"].handle
    assert wait_for(ready.exists)
    alloc.revoke(runner.running["s"].lease_id, reason="operator")
    runner.step(clock.advance(1.0))
    assert wait_for(term.exists)
    assert handle.poll() is None  # the step returned while the process still runs
    assert q.get("s").state is JobState.QUEUED and "s" not in runner.running
    runner.step(clock.advance(1.0))
    assert "s" not in runner.running and "still stopping" in runner.waiting["s"]
    go.touch()
    assert wait_for(lambda: handle.poll() is not None)
    runner.step(clock.advance(1.0))
    assert q.get("s").state is JobState.RUNNING and q.get("s").attempts == 2
    runner.stop_all(now=clock.advance(1.0))
    assert q.get("s").state is JobState.QUEUED


def test_stop_all_stops_every_job_that_ignores_sigterm_within_one_grace_period(tmp_path):
    clock, alloc, q, _ = setup(tmp_path)
    runner = BatchRunner(q, alloc, LocalExecutor(), lease_ttl_s=3600.0, stop_grace_s=0.2)
    files = []
    for i in ("a", "b", "c"):
        spec, ready, term, _go = stubborn(i, tmp_path, vram=1000)
        q.submit(spec, now=0.0)
        files.append((ready, term))
    runner.step(clock.now())
    handles = [r.handle for r in runner.running.values()]
    assert len(handles) == 3 and wait_for(lambda: all(r.exists() for r, _ in files))
    runner.stop_all(now=clock.advance(1.0))
    assert all(t.exists() for _, t in files)  # each got SIGTERM first
    assert all(h.poll() == -9 for h in handles)  # then SIGKILL
    assert [r.state for r in q.jobs()] == [JobState.QUEUED] * 3
    assert alloc.slice_state("gpu-0").granted.vram_mib == 0


def test_a_damaged_job_row_is_skipped_and_reported_once_and_the_queue_goes_on(tmp_path):
    """One row that is not a job (corrupt JSON: damage on disk, a hand edit) made every step raise
    before any job started: the whole queue stalled. It is skipped, reported once (the runner's
    log, naming the row), and the jobs after it run."""
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(BatchJobSpec(id="bad", vram_mib=1000, command=("true",), deadline_s=1.0), now=0.0)
    q.submit(BatchJobSpec(id="ok", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=1.0)
    q._db.execute("UPDATE batch_jobs SET spec = '{broken' WHERE id = 'bad'")
    runner.step(clock.now())
    assert set(runner.running) == {"ok"}
    assert "'bad'" in runner.damaged["bad"] and "JSONDecodeError" in runner.damaged["bad"]
    assert wait_for(lambda: runner.running["ok"].handle.poll() is not None)
    runner.step(clock.advance(1.0))
    assert q.get("ok").state is JobState.DONE
    skipped = [(job_id, what) for _, job_id, what in runner.log if what.startswith("skipped")]
    assert len(skipped) == 1 and skipped[0][0] == "bad" and "damaged" in skipped[0][1]  # once
    assert q._db.execute("SELECT state FROM batch_jobs WHERE id = 'bad'").fetchone()[0] == "queued"
    alloc.check_invariants()


def damage(tmp_path, job_id: str) -> None:
    """Corrupt the stored spec of ``job_id`` in the queue's file, from another connection."""
    db = sqlite3.connect(tmp_path / "jobs.db")
    with db:
        db.execute("UPDATE batch_jobs SET spec = '{broken' WHERE id = ?", (job_id,))
    db.close()


def test_a_running_job_whose_row_is_damaged_is_stopped_reported_once_and_the_others_go_on(tmp_path):
    """A RUNNING checkpointable job whose row was damaged, then preempted: reading it back raised at
    every step, so no other job was paused, resumed, started or renewed. Its process is stopped, its
    lease is released, it is reported once naming it, and the other jobs go on."""
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(sleeper("ckpt", checkpointable=True), now=0.0)
    q.submit(sleeper("other", checkpointable=True, vram=1000), now=1.0)
    runner.step(clock.now())
    assert set(runner.running) == {"ckpt", "other"}
    handle = runner.running["ckpt"].handle
    damage(tmp_path, "ckpt")
    out = alloc.allocate(p0("agent-1"), preempt=True)
    assert out.granted and [v.request.id for v in out.victims] == ["job/ckpt/1"]
    q.submit(BatchJobSpec(id="later", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=2.0)
    runner.step(clock.advance(1.0))
    assert wait_for(lambda: handle.poll() is not None)  # stopped
    assert set(runner.running) == {"other", "later"} and not runner.paused
    assert wait_for(lambda: runner.running["later"].handle.poll() is not None)
    runner.step(clock.advance(1.0))
    runner.step(clock.advance(1.0))
    assert not runner.stopping and set(runner.damaged) == {"ckpt"}
    skipped = [(job_id, what) for _, job_id, what in runner.log if what.startswith("skipped")]
    assert len(skipped) == 1 and skipped[0][0] == "ckpt" and "'ckpt'" in skipped[0][1]  # once
    assert q.get("later").state is JobState.DONE and q.get("other").state is JobState.RUNNING
    assert q._db.execute("SELECT state FROM batch_jobs WHERE id = 'ckpt'").fetchone()[0] == "queued"
    assert alloc.slice_state("gpu-0").granted.vram_mib == 8000 + 1000  # P0 and "other" only
    runner.running["other"].handle.stop()
    alloc.check_invariants()


def test_a_paused_job_whose_row_is_damaged_is_stopped_not_resumed_and_the_others_go_on(tmp_path):
    """A PAUSED job whose row was damaged: reading it back to resume it raised at every step. Its
    (stopped) process is ended, it is reported once, and the queued jobs start."""
    clock, alloc, q, runner = setup(tmp_path)
    q.submit(sleeper("ckpt", checkpointable=True), now=0.0)
    runner.step(clock.now())
    pid = runner.running["ckpt"].handle.proc.pid  # type: ignore[attr-defined]
    handle = runner.running["ckpt"].handle
    out = alloc.allocate(p0("agent-1"), preempt=True)
    assert out.granted
    runner.step(clock.advance(1.0))
    assert q.get("ckpt").state is JobState.PAUSED and wait_for(lambda: proc_state(pid) == "T")
    damage(tmp_path, "ckpt")
    alloc.release(out.lease.id)
    q.submit(BatchJobSpec(id="later", vram_mib=1000, command=(sys.executable, "-c", "pass")), now=2.0)
    runner.step(clock.advance(1.0))
    assert wait_for(lambda: handle.poll() is not None)  # ended, not resumed
    assert not runner.paused and "ckpt" not in runner.running and "later" in runner.running
    assert wait_for(lambda: runner.running["later"].handle.poll() is not None)
    runner.step(clock.advance(1.0))
    runner.step(clock.advance(1.0))
    assert q.get("later").state is JobState.DONE and not runner.stopping
    skipped = [(job_id, what) for _, job_id, what in runner.log if what.startswith("skipped")]
    assert len(skipped) == 1 and skipped[0][0] == "ckpt" and "'ckpt'" in skipped[0][1]
    assert q._db.execute("SELECT state FROM batch_jobs WHERE id = 'ckpt'").fetchone()[0] == "queued"
    assert alloc.slice_state("gpu-0").granted.vram_mib == 0
    alloc.check_invariants()


def test_step_down_writes_nothing_and_returns_while_a_job_that_ignores_sigterm_runs(tmp_path):
    """A leader stepping down (its writes refused: another replica leads) stopped its jobs as at a
    shutdown, waiting on the event loop for each process; `step_down` sends SIGTERM, writes
    nothing and returns; SIGKILL follows after the grace period, off the caller's thread."""
    clock = ManualClock(0.0)
    alloc = Allocator([GPU], clock=clock)
    q = RefusingQueue(tmp_path / "jobs.db")
    runner = BatchRunner(q, alloc, LocalExecutor(), lease_ttl_s=3600.0, stop_grace_s=0.5)
    spec, ready, term, _go = stubborn("s", tmp_path, vram=1000)
    q.submit(spec, now=0.0)
    runner.step(clock.now())
    assert wait_for(ready.exists)
    q.refuse = True
    handles = runner.step_down()  # (a write would raise here)
    assert len(handles) == 1 and handles[0].poll() is None  # returned while the process runs
    assert runner.running == {} and runner.paused == {} and runner.stopping == {}
    assert wait_for(term.exists)
    assert wait_for(lambda: handles[0].poll() is not None) and handles[0].poll() == -9
    assert q.get("s").state is JobState.RUNNING  # left for the next leader to requeue
