"""`BatchService`: the batch queue + its runner as one object the gateway serves (``/v1/batch/jobs``).

Role: submit / list / get / cancel jobs (JSON-ready dicts) and `step` the runner. Every call runs on
the gateway's event loop thread (the routes and the tidal loop), so the runner's process handles
and the SQLite queue are never used from two threads. Time comes from the injected ``now``.
`cancel` answers once the job's process is gone and its lease released, and never holds the loop
meanwhile: it awaits (polling every `STOP_POLL_S`) while SIGTERM, then SIGKILL after the runner's
grace period, ends a process that ignores SIGTERM. `step_down` (a leader that lost its election)
returns at once too: no write, the processes killed after the grace period off the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gpupool.adapters.batch.queue import BatchJobQueue
from gpupool.adapters.batch.runner import BatchRunner
from gpupool.core.tidal.jobs import BatchJobSpec, JobRecord, JobState

STOP_POLL_S = 0.02


def job_json(rec: JobRecord, waiting: str | None = None) -> dict[str, Any]:
    """The job as the API shows it; ``waiting``: why a queued job has not started (the runner's last
    refusal, e.g. ``unresolvable: ...``), None when unknown or not queued."""
    s = rec.spec
    return {
        "id": s.id,
        "state": rec.state.value,
        "command": list(s.command),
        "vram_mib": s.vram_mib,
        "compute_milli": s.compute_milli,
        "checkpointable": s.checkpointable,
        "deadline_s": s.deadline_s,
        "tenant": s.tenant,
        "submitted_at": rec.submitted_at,
        "attempts": rec.attempts,
        "lease_id": rec.lease_id or None,
        "reason": rec.reason,
        "returncode": rec.returncode,
        "waiting": waiting if rec.state is JobState.QUEUED else None,
    }


class BatchService:
    def __init__(self, queue: BatchJobQueue, runner: BatchRunner, *, now: Callable[[], float]) -> None:
        self.queue = queue
        self.runner = runner
        self.now = now

    def submit(self, spec: BatchJobSpec) -> dict[str, Any]:
        return job_json(self.queue.submit(spec, now=self.now()))

    def jobs(self, state: JobState | None = None) -> list[dict[str, Any]]:
        return [job_json(r, self.runner.waiting.get(r.spec.id)) for r in self.queue.jobs(state)]

    def job(self, job_id: str) -> dict[str, Any]:
        return job_json(self.queue.get(job_id), self.runner.waiting.get(job_id))

    async def cancel(self, job_id: str) -> dict[str, Any]:
        out = job_json(self.runner.cancel(job_id, now=self.now(), reason="cancelled by operator"))
        while job_id in self.runner.stopping:  # (the loop serves other calls meanwhile)
            await asyncio.sleep(STOP_POLL_S)
            self.runner.reap_stopped()
        return out

    def counts(self) -> dict[str, int]:
        """Jobs per state, and ``damaged``: rows that are not jobs (only when there are any)."""
        out = {s.value: 0 for s in JobState}
        damaged: dict[str, str] = {}
        for r in self.queue.jobs(damaged=damaged):
            out[r.state.value] += 1
        if damaged:
            out["damaged"] = len(damaged)
        return out

    def step(self) -> None:
        self.runner.step(self.now())

    def close(self) -> None:
        """Shutdown: every process stopped (at most one grace period), its job requeued."""
        self.runner.stop_all(now=self.now())
        self.queue.close()

    def step_down(self) -> None:
        """A leader that lost its election: the processes are told to end and killed after the grace
        period off the loop (`BatchRunner.step_down`); nothing is written, nothing waited for."""
        self.runner.step_down()
        self.queue.close()


__all__ = ["BatchService", "job_json"]
