"""`PauserBase`: the timing and result bookkeeping every pauser in this package shares.

Role: each pauser (signals, cgroup freezer, vLLM, cuda-checkpoint) reads a start time from its
clock, asks its own `check` before touching anything, does its work and reports a `PauseResult`
stamped with the finish time. This module does that part once; a pauser supplies ``name``,
``frees``, ``check`` and the work itself, returned as a `Step`.

Invariants:
- The clock is injected (default ``time.monotonic``). ``started_at_s`` is read before `check`
  runs and ``finished_at_s`` after the work (or the refusal), so a result's latency covers both.
- `PauserBase._attempt` never runs the work when `check` refuses: it returns ``ok=False``,
  ``refused=True`` and the reason. It does not catch exceptions: each pauser turns its expected
  failures into a ``Step(ok=False, ...)`` itself and lets bugs raise.
- `PauserBase._declined` reports an action the pauser never performs (``ok=False``, not a refusal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.core.clock import Clock, FunctionClock
from gpupool.core.pausers import Frees, PauseAction, PauseResult, Workload


@dataclass(frozen=True, slots=True)
class Step:
    """What the work of one action did: success, a reason for the log, and the VRAM it freed."""

    ok: bool
    reason: str
    vram_freed_mib: int = 0


class PauserBase:
    """Clock, check-first and result building for one pauser; subclasses set ``name`` and ``frees``."""

    name: str
    frees: Frees

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or FunctionClock(time.monotonic)

    def check(self, workload: Workload) -> str | None:
        """None when this pauser can handle ``workload``; otherwise the reason it refuses."""
        raise NotImplementedError

    def _attempt(self, workload: Workload, action: PauseAction, work: Callable[[], Step]) -> PauseResult:
        """Run ``work`` for ``action`` unless `check` refuses; time it on the injected clock."""
        start = self._clock.now()
        refusal = self.check(workload)
        if refusal is not None:
            return self._result(workload, action, start, Step(ok=False, reason=refusal), refused=True)
        return self._result(workload, action, start, work())

    def _declined(self, workload: Workload, action: PauseAction, reason: str) -> PauseResult:
        """``ok=False`` for an action this pauser does not perform (nothing is touched)."""
        return self._result(workload, action, self._clock.now(), Step(ok=False, reason=reason))

    def _result(
        self, workload: Workload, action: PauseAction, start: float, step: Step, *, refused: bool = False
    ) -> PauseResult:
        return PauseResult(
            workload.lease_id,
            self.name,
            action,
            step.ok,
            self.frees,
            start,
            self._clock.now(),
            reason=step.reason,
            refused=refused,
            vram_freed_mib=step.vram_freed_mib,
        )
