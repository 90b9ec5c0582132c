"""`BatchRunner`: the loop that turns queued P2 jobs into running processes holding P2 leases.

One `step(now)`:
1. finished jobs -> DONE (exit 0) or FAILED, lease released; stopped jobs whose process is now gone
   release the lease they still held; over ``max_running``, the newest running jobs release their
   leases (handled as in 2.);
2. running jobs whose lease ended (preempted by P0/P1, revoked, expired) -> paused (SIGSTOP, state
   PAUSED) when the job is checkpointable and the executor can pause, else stopped and requeued
   (state QUEUED, attempts counted): never silently dropped; a requeued job is not started again
   while its previous process is still there;
3. paused jobs get a new P2 lease when the pool has room again -> resumed (SIGCONT, RUNNING);
4. queued jobs are claimed in the core's queue order while the allocator grants leases; a job
   whose command cannot be run (the executor's start raises `OSError` / `ValueError`: not found,
   not executable) is FAILED with the reason and its lease released; any other start failure
   releases the lease, requeues the job and is raised;
5. running jobs' leases are renewed.
Why a queued job does not start is kept in memory (`waiting`: the last refusal's code and reason,
e.g. ``unresolvable: no healthy slice ... could ever hold 1000000 MiB``), not stored: the listing
shows it, so a job the pool cannot hold does not wait in silence; it is recomputed every step.
A queued row that is not a job (damaged on disk, a hand edit) is skipped, so the jobs after it
still start; it is kept in ``damaged`` and reported once in the log (``skipped: ...``, naming it).
A running or paused job whose row is found damaged when it is read back (its lease ended, or it is
due to resume) is requeued by its state alone, its process stopped (the lease it holds is released
once the process is gone) and then skipped and reported like a damaged queued row. The runner's
other writes (`set_state`) do not read the row back: on the SQLite queue only its state column.
The caller owns the clock (``now``) and the lease port (an `Allocator`, or the gateway's
`LeaseController` through `ControllerLeases`, so job leases pass the same admission, the same
durable store and the same events as every other lease); the runner never reads a clock itself.

``max_running`` (a callable: the tidal plane's DAY batch concurrency, None: no limit) bounds step 4;
``on_path`` hears how displaced work was handled (``pause`` / ``requeue``) and how long the pauser
took, timed by the injected ``stopwatch`` (seconds; `time.perf_counter` in the CLI).
`cancel` stops a job's process (if any), releases its lease and marks it CANCELLED.

Stopping never waits: the handle's ``terminate`` sends SIGTERM and returns (SIGKILL follows after
``stop_grace_s``, off the caller's thread), and the job waits in ``stopping`` until its process is
gone; only then is the lease it still holds released (`reap_stopped`, at every step). The runner
runs on the gateway's event loop, which a job that ignores SIGTERM must not hold up. `stop_all`
(shutdown) alone waits, for all the processes at once: at most one grace period in all.
`step_down` (a leader that lost its election) neither waits nor writes: every process is told to
end the same way (SIGKILL after the grace period, off the caller's thread) and the runner forgets
its jobs; the store already refuses this replica's writes, and the next leader requeues the jobs
and releases their leases (`gpupool.cli.tidalplane.attach_tidal`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.adapters.batch.queue import BatchJobQueue
from gpupool.core.controller import LeaseController
from gpupool.core.errors import InvalidInput, StoreDamaged, StoreRefused
from gpupool.core.model import Lease, Request
from gpupool.core.outcome import Outcome
from gpupool.core.tidal.jobs import FINAL, BatchJobSpec, JobRecord, JobState, lease_request


class Handle(Protocol):
    def poll(self) -> int | None: ...
    def pause(self) -> bool: ...
    def resume(self) -> bool: ...
    def terminate(self, *, grace_s: float = 2.0) -> None:
        """Ask the job to end now (SIGTERM), force it after ``grace_s``; never waits."""

    def stop(self, *, grace_s: float = 2.0) -> int:
        """`terminate`, then wait until the job is gone; its exit status."""


class LeasePort(Protocol):
    """What the runner needs of a lease owner (an `Allocator` has exactly these)."""

    def allocate(self, request: Request, *, preempt: bool = True) -> Outcome: ...
    def get(self, lease_id: str) -> Lease: ...
    def release(self, lease_id: str, *, reason: str = "") -> Outcome: ...
    def renew(self, lease_id: str, ttl_s: float | None = None) -> Outcome: ...


class ControllerLeases:
    """`LeasePort` over a `LeaseController`: ``allocate`` is an admission that never queues (P2 work
    without room is refused at once: the batch queue itself is the waiting line)."""

    def __init__(self, controller: LeaseController) -> None:
        self.controller = controller

    def allocate(self, request: Request, *, preempt: bool = True) -> Outcome:
        return self.controller.acquire(request, queue=False)

    def get(self, lease_id: str) -> Lease:
        return self.controller.get(lease_id)

    def release(self, lease_id: str, *, reason: str = "") -> Outcome:
        return self.controller.release(lease_id, reason=reason)

    def renew(self, lease_id: str, ttl_s: float | None = None) -> Outcome:
        return self.controller.renew(lease_id, ttl_s=ttl_s)


class Executor(Protocol):
    name: str

    def accepts(self, spec: BatchJobSpec) -> bool: ...
    def start(self, spec: BatchJobSpec, *, lease_id: str) -> Handle: ...


@dataclass(slots=True)
class _Running:
    handle: Handle
    lease_id: str
    attempt: int


def _no_limit() -> int | None:
    return None


def _no_time() -> float:
    return 0.0


@dataclass(slots=True)
class BatchRunner:
    queue: BatchJobQueue
    allocator: LeasePort
    executor: Executor
    worker: str = "runner-0"
    lease_ttl_s: float = 60.0
    running: dict[str, _Running] = field(default_factory=dict)
    paused: dict[str, _Running] = field(default_factory=dict)
    stopping: dict[str, _Running] = field(default_factory=dict)
    """Job id -> a process told to end (cancel, requeue) that may still be there; its lease is held."""
    stop_grace_s: float = 2.0
    waiting: dict[str, str] = field(default_factory=dict)
    """Queued job id -> why its last lease request was refused (``code: reason``); see the docstring."""
    damaged: dict[str, str] = field(default_factory=dict)
    """Queued job id -> why its stored row is not a job (skipped; reported once in the log)."""
    log: list[tuple[float, str, str]] = field(default_factory=list)
    max_running: Callable[[], int | None] = _no_limit
    on_path: Callable[[str, float], None] | None = None
    stopwatch: Callable[[], float] = _no_time

    def step(self, now: float) -> None:
        self._reap(now)
        self.reap_stopped()
        self._shrink(now)
        self._on_lost_leases(now)
        self._resume_paused(now)
        self.waiting.clear()
        self._start_queued(now)
        for r in self.running.values():
            self.allocator.renew(r.lease_id)

    def cancel(self, job_id: str, *, now: float, reason: str = "cancelled") -> JobRecord:
        """Stop the job's process (if it has one), release its lease, mark it CANCELLED."""
        rec = self.queue.get(job_id)
        if rec.state in FINAL:
            raise InvalidInput("job", job_id, f"is already {rec.state.value}")
        # recorded first: a store that refuses the write leaves the job as it was (the caller retries)
        out = self.queue.transition(job_id, JobState.CANCELLED, now=now, reason=reason)
        r = self.running.pop(job_id, None) or self.paused.pop(job_id, None)
        if r is not None:
            r.handle.terminate(grace_s=self.stop_grace_s)
            self.stopping[job_id] = r
            self.reap_stopped()
        self._event(now, job_id, "cancelled")
        return out

    def reap_stopped(self) -> None:
        """Release the lease of every stopped job whose process is gone."""
        for job_id, r in list(self.stopping.items()):
            if r.handle.poll() is None:
                continue
            del self.stopping[job_id]
            self.allocator.release(r.lease_id, reason=f"job {job_id} stopped")

    def stop_all(self, *, now: float) -> None:
        """Shutdown: stop every process, then release its lease and requeue its job (the next start,
        or the next leader, runs it again). Every process is stopped before any write: a runner
        stepping down may find its writes refused (another replica leads; that one requeues the
        jobs itself), and a refused write must not leave a process running. The first refused
        write is raised once every job was tried."""
        held = [*self.running.items(), *self.paused.items()]
        stopping = list(self.stopping.items())  # (already cancelled or requeued: only their leases)
        self.running.clear()
        self.paused.clear()
        self.stopping.clear()
        for _, r in held:  # every process told first, then waited for: one grace period in all
            r.handle.terminate(grace_s=self.stop_grace_s)
        for _, r in [*held, *stopping]:
            r.handle.stop(grace_s=self.stop_grace_s)
        first: Exception | None = None
        for _, r in stopping:
            try:
                self.allocator.release(r.lease_id, reason="batch runner stopped")
            except Exception as exc:  # (the store's refusal: its type is the store adapter's)
                first = first or exc
        for job_id, r in held:
            try:
                self.allocator.release(r.lease_id, reason="batch runner stopped")
                self.queue.set_state(job_id, JobState.QUEUED, now=now, reason="runner stopped; requeued")
            except Exception as exc:  # (the store's refusal: its type is the store adapter's)
                first = first or exc
        if first is not None:
            raise first

    def step_down(self) -> list[Handle]:
        """A leader stepping down: SIGTERM to every process now (SIGKILL after ``stop_grace_s``, off
        this thread), no write, no wait; the runner holds no job afterwards. The handles told to
        end (those of jobs already stopping included)."""
        held = [*self.running.values(), *self.paused.values(), *self.stopping.values()]
        self.running.clear()
        self.paused.clear()
        self.stopping.clear()
        for r in held:
            r.handle.terminate(grace_s=self.stop_grace_s)  # (a second call changes nothing)
        return [r.handle for r in held]

    def _event(self, now: float, job_id: str, what: str) -> None:
        self.log.append((now, job_id, what))

    def _reap(self, now: float) -> None:
        for job_id, r in list(self.running.items()):
            rc = r.handle.poll()
            if rc is None:
                continue
            state = JobState.DONE if rc == 0 else JobState.FAILED
            # recorded first: a store that refuses the write leaves the job here, reaped next step
            self.queue.set_state(job_id, state, now=now, returncode=rc, reason=f"exit {rc}")
            del self.running[job_id]
            self.allocator.release(r.lease_id, reason=f"job {job_id} exited {rc}")
            self._event(now, job_id, state.value)

    def _on_lost_leases(self, now: float) -> None:
        for job_id, r in list(self.running.items()):
            lease = self.allocator.get(r.lease_id)
            if not lease.state.ended:
                continue
            spec = self._spec(job_id, now, self.running)
            if spec is None:
                continue
            del self.running[job_id]
            why = f"lease {lease.state.value}: {lease.reason}"
            t0 = self.stopwatch()
            if spec.checkpointable and r.handle.pause():
                self.paused[job_id] = r
                self._path("pause", t0)
                self.queue.set_state(job_id, JobState.PAUSED, now=now, reason=why)
                self._event(now, job_id, "paused")
            else:
                r.handle.terminate(grace_s=self.stop_grace_s)
                self.stopping[job_id] = r  # (not started again until its process is gone)
                self._path("requeue", t0)
                self.queue.set_state(job_id, JobState.QUEUED, now=now, reason=f"{why}; requeued")
                self._event(now, job_id, "requeued")

    def _spec(self, job_id: str, now: float, held: dict[str, _Running]) -> BatchJobSpec | None:
        """The spec of ``job_id`` (in ``held``: running or paused) read back from the queue; None when
        its row is no job any more: requeued by its state (recorded first: a refused write keeps it
        in ``held``, tried again next step), its process stopped, reported once (see the docstring)."""
        try:
            return self.queue.get(job_id).spec
        except StoreDamaged as exc:
            why = str(exc)
        with contextlib.suppress(StoreDamaged):  # (etcd: a damaged value cannot be rewritten; it stays)
            self.queue.set_state(job_id, JobState.QUEUED, now=now, reason="damaged row: stopped, requeued")
        r = held.pop(job_id)
        r.handle.terminate(grace_s=self.stop_grace_s)
        self.stopping[job_id] = r  # (its lease is released once the process is gone)
        self.damaged[job_id] = why  # (`_start_queued` skips it from now on, without a second report)
        self._event(now, job_id, f"skipped: {why}; its process is stopped and its lease released")
        return None

    def _shrink(self, now: float) -> None:
        """Over ``max_running`` (NIGHT -> DAY): the newest jobs give their leases back and are
        paused or requeued like preempted ones (the oldest keep running)."""
        limit = self.max_running()
        if limit is None or len(self.running) <= limit:
            return
        for job_id in list(self.running)[limit:]:
            r = self.running[job_id]
            self.allocator.release(r.lease_id, reason=f"job {job_id}: batch concurrency is {limit} now")

    def _path(self, path: str, t0: float) -> None:
        if self.on_path is not None:
            self.on_path(path, (self.stopwatch() - t0) * 1000.0)

    def _resume_paused(self, now: float) -> None:
        limit = self.max_running()
        for job_id, r in list(self.paused.items()):
            if limit is not None and len(self.running) >= limit:
                return
            spec = self._spec(job_id, now, self.paused)
            if spec is None:
                continue
            attempt = r.attempt + 1
            out = self.allocator.allocate(
                lease_request(spec, attempt=attempt, ttl_s=self.lease_ttl_s), preempt=False
            )
            if not out.granted or out.lease is None:
                continue
            del self.paused[job_id]
            r.handle.resume()
            self.running[job_id] = _Running(r.handle, out.lease.id, attempt)
            self.queue.set_state(job_id, JobState.RUNNING, now=now, lease_id=out.lease.id, reason="resumed")
            self._event(now, job_id, "resumed")

    def _start_queued(self, now: float) -> None:
        """Every queued job in queue order that the pool can lease now (later ones may overtake
        a job that does not fit: work-conserving, still in the total order among those that fit)."""
        limit = self.max_running()
        damaged: dict[str, str] = {}
        queued = self.queue.jobs(JobState.QUEUED, damaged=damaged)
        for job_id, why in damaged.items():
            if job_id not in self.damaged:
                self._event(now, job_id, f"skipped: {why}")
        self.damaged = damaged
        for rec in queued:
            if limit is not None and len(self.running) >= limit:
                return
            spec = rec.spec
            if not self.executor.accepts(spec):
                continue
            if spec.id in self.stopping:
                self.waiting[spec.id] = "still stopping: its previous process has not exited yet"
                continue
            attempt = rec.attempts + 1
            try:
                out = self.allocator.allocate(
                    lease_request(spec, attempt=attempt, ttl_s=self.lease_ttl_s), preempt=False
                )
            except InvalidInput as exc:  # a job no lease can ever carry (stored before a check existed)
                self.queue.transition(spec.id, JobState.FAILED, now=now, reason=f"cannot be leased: {exc}")
                self._event(now, spec.id, "failed")
                continue
            if not out.granted or out.lease is None:
                self.waiting[spec.id] = f"{out.code.value}: {out.reason}" if out.reason else out.code.value
                continue
            try:
                claimed = self.queue.claim(spec.id, worker=self.worker, now=now, lease_id=out.lease.id)
            except StoreRefused:  # the queue cannot record the start: no lease is kept for it
                self.allocator.release(out.lease.id, reason="the batch queue refused the claim")
                raise
            if claimed is None:  # another runner took it first
                self.allocator.release(out.lease.id, reason="lost the claim race")
                continue
            try:
                handle = self.executor.start(spec, lease_id=out.lease.id)
            except (OSError, ValueError) as exc:  # the command cannot be run (not found, not executable)
                self.allocator.release(out.lease.id, reason=f"job {spec.id} could not start")
                self.queue.transition(spec.id, JobState.FAILED, now=now, reason=f"cannot start: {exc}")
                self._event(now, spec.id, "failed")
                continue
            except Exception:  # anything else may pass (an executor's connection): requeued, raised
                self.allocator.release(out.lease.id, reason=f"job {spec.id} could not start")
                self.queue.transition(spec.id, JobState.QUEUED, now=now, reason="start failed; requeued")
                raise
            self.running[spec.id] = _Running(handle, out.lease.id, attempt)
            self._event(now, spec.id, "started")
