"""`SignalPauser`: SIGSTOP / SIGCONT to a workload's process group (or its listed pids).

Role: the cheapest pauser; stops compute within one syscall. It frees no VRAM: the CUDA context and
every device allocation stay (gpu-facts 5.2), so `frees` is `Frees.COMPUTE`.

Invariants:
- Signals go to the process group when ``workload.pgid`` is set (the whole job tree), otherwise to
  each pid in ``workload.pids``; a workload with neither is refused by `check`, and so is one whose
  group or pids would include the agent itself or its parent (`procfs.self_target`).
- ``pause`` never blocks on confirmation unless ``confirm_timeout_s > 0``; ``is_paused`` reads
  ``/proc/PID/stat`` (state ``T``) of the group leader or the listed pids.
- ``terminate`` sends SIGKILL (works on a stopped process) and never raises for a vanished job.
"""

from __future__ import annotations

import math
import os
import signal
import time

from gpupool.adapters.pause.base import PauserBase, Step
from gpupool.adapters.pause.procfs import is_stopped, proc_state, self_target
from gpupool.core.clock import Clock
from gpupool.core.pausers import Frees, PauseAction, PauseResult, Workload


class SignalPauser(PauserBase):
    name = "signal"
    frees = Frees.COMPUTE
    vram_free_estimate_s = math.inf

    def __init__(self, *, clock: Clock | None = None, confirm_timeout_s: float = 0.0) -> None:
        super().__init__(clock=clock)
        self._confirm_timeout_s = confirm_timeout_s

    # ------------------------------------------------------------------ protocol
    def check(self, workload: Workload) -> str | None:
        if workload.pgid is None and not workload.pids:
            return "signal pauser needs a process group (pgid) or pids"
        return self_target(workload.pgid, workload.pids)

    def pause(self, workload: Workload) -> PauseResult:
        return self._send(workload, signal.SIGSTOP, PauseAction.PAUSE)

    def resume(self, workload: Workload) -> PauseResult:
        return self._send(workload, signal.SIGCONT, PauseAction.RESUME)

    def terminate(self, workload: Workload) -> PauseResult:
        return self._send(workload, signal.SIGKILL, PauseAction.TERMINATE)

    def is_paused(self, workload: Workload) -> bool:
        pids = self._watched(workload)
        return bool(pids) and all(is_stopped(p) for p in pids)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _watched(workload: Workload) -> tuple[int, ...]:
        if workload.pids:
            return workload.pids
        return (workload.pgid,) if workload.pgid is not None else ()

    def _send(self, workload: Workload, sig: signal.Signals, action: PauseAction) -> PauseResult:
        def work() -> Step:
            try:
                if workload.pgid is not None:
                    os.killpg(workload.pgid, sig)
                else:
                    for pid in workload.pids:
                        os.kill(pid, sig)
            except ProcessLookupError:
                gone = action is PauseAction.TERMINATE
                return Step(ok=gone, reason=f"{sig.name}: no such process (job gone)")
            except PermissionError as exc:
                return Step(ok=False, reason=f"{sig.name}: {exc}")
            confirm = action is PauseAction.PAUSE and self._confirm_timeout_s > 0
            if confirm and not self._wait(workload, stopped=True):
                return Step(
                    ok=False, reason=f"SIGSTOP sent but not stopped after {self._confirm_timeout_s:.3f} s"
                )
            return Step(ok=True, reason=f"{sig.name} sent")

        return self._attempt(workload, action, work)

    def _wait(self, workload: Workload, *, stopped: bool) -> bool:
        deadline = time.monotonic() + self._confirm_timeout_s
        pids = self._watched(workload)
        while True:
            states = [proc_state(p) for p in pids]
            if all((s in ("T", "t")) == stopped or s is None for s in states):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
