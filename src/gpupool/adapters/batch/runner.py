"""`BatchRunner`: the loop that turns queued P2 jobs into running processes holding P2 leases.

One `step(now)`:
1. finished jobs -> DONE (exit 0) or FAILED, lease released;
2. running jobs whose lease ended (preempted by P0/P1, revoked, expired) -> paused (SIGSTOP, state
   PAUSED) when the job is checkpointable and the executor can pause, else stopped and requeued
   (state QUEUED, attempts counted): never silently dropped;
3. paused jobs get a new P2 lease when the pool has room again -> resumed (SIGCONT, RUNNING);
4. queued jobs are claimed in the core's queue order while the allocator grants leases;
5. running jobs' leases are renewed.
The caller owns the clock (``now``) and the allocator; the runner never reads a clock itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpupool.adapters.batch.queue import BatchJobQueue
from gpupool.core import Allocator
from gpupool.core.tidal.jobs import BatchJobSpec, JobState, lease_request


class Handle(Protocol):
    def poll(self) -> int | None: ...
    def pause(self) -> bool: ...
    def resume(self) -> bool: ...
    def stop(self, *, grace_s: float = 2.0) -> int: ...


class Executor(Protocol):
    name: str

    def accepts(self, spec: BatchJobSpec) -> bool: ...
    def start(self, spec: BatchJobSpec, *, lease_id: str) -> Handle: ...


@dataclass(slots=True)
class _Running:
    handle: Handle
    lease_id: str
    attempt: int


@dataclass(slots=True)
class BatchRunner:
    queue: BatchJobQueue
    allocator: Allocator
    executor: Executor
    worker: str = "runner-0"
    lease_ttl_s: float = 60.0
    running: dict[str, _Running] = field(default_factory=dict)
    paused: dict[str, _Running] = field(default_factory=dict)
    log: list[tuple[float, str, str]] = field(default_factory=list)

    def step(self, now: float) -> None:
        self._reap(now)
        self._on_lost_leases(now)
        self._resume_paused(now)
        self._start_queued(now)
        for r in self.running.values():
            self.allocator.renew(r.lease_id)

    def _event(self, now: float, job_id: str, what: str) -> None:
        self.log.append((now, job_id, what))

    def _reap(self, now: float) -> None:
        for job_id, r in list(self.running.items()):
            rc = r.handle.poll()
            if rc is None:
                continue
            del self.running[job_id]
            self.allocator.release(r.lease_id, reason=f"job {job_id} exited {rc}")
            state = JobState.DONE if rc == 0 else JobState.FAILED
            self.queue.transition(job_id, state, now=now, returncode=rc, reason=f"exit {rc}")
            self._event(now, job_id, state.value)

    def _on_lost_leases(self, now: float) -> None:
        for job_id, r in list(self.running.items()):
            lease = self.allocator.get(r.lease_id)
            if not lease.state.ended:
                continue
            del self.running[job_id]
            spec = self.queue.get(job_id).spec
            why = f"lease {lease.state.value}: {lease.reason}"
            if spec.checkpointable and r.handle.pause():
                self.paused[job_id] = r
                self.queue.transition(job_id, JobState.PAUSED, now=now, reason=why)
                self._event(now, job_id, "paused")
            else:
                r.handle.stop()
                self.queue.transition(job_id, JobState.QUEUED, now=now, reason=f"{why}; requeued")
                self._event(now, job_id, "requeued")

    def _resume_paused(self, now: float) -> None:
        for job_id, r in list(self.paused.items()):
            spec = self.queue.get(job_id).spec
            attempt = r.attempt + 1
            out = self.allocator.allocate(
                lease_request(spec, attempt=attempt, ttl_s=self.lease_ttl_s), preempt=False
            )
            if not out.granted or out.lease is None:
                continue
            del self.paused[job_id]
            r.handle.resume()
            self.running[job_id] = _Running(r.handle, out.lease.id, attempt)
            self.queue.transition(job_id, JobState.RUNNING, now=now, lease_id=out.lease.id, reason="resumed")
            self._event(now, job_id, "resumed")

    def _start_queued(self, now: float) -> None:
        """Every queued job in queue order that the pool can lease now (later ones may overtake
        a job that does not fit: work-conserving, still in the total order among those that fit)."""
        for rec in self.queue.jobs(JobState.QUEUED):
            spec = rec.spec
            if not self.executor.accepts(spec):
                continue
            attempt = rec.attempts + 1
            out = self.allocator.allocate(
                lease_request(spec, attempt=attempt, ttl_s=self.lease_ttl_s), preempt=False
            )
            if not out.granted or out.lease is None:
                continue
            claimed = self.queue.claim(spec.id, worker=self.worker, now=now, lease_id=out.lease.id)
            if claimed is None:  # another runner took it first
                self.allocator.release(out.lease.id, reason="lost the claim race")
                continue
            handle = self.executor.start(spec, lease_id=out.lease.id)
            self.running[spec.id] = _Running(handle, out.lease.id, attempt)
            self._event(now, spec.id, "started")
