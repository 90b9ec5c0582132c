"""`CgroupFreezerPauser`: the cgroup v2 freezer (``cgroup.freeze``) for a workload's whole cgroup.

Role: pauses every process of a container or job cgroup at once, including ones it forks later.
Like SIGSTOP it frees compute only (`Frees.COMPUTE`): device memory stays allocated.

Invariants:
- ``workload.cgroup`` is an absolute path to a cgroup v2 directory (one containing
  ``cgroup.freeze``); anything else is refused by `check` with the reason, and so is the cgroup the
  agent itself runs in or any ancestor of it (freezing or killing it would take the agent along).
- ``pause`` writes ``1``, ``resume`` writes ``0``; the kernel freezes asynchronously, so
  ``is_paused`` reads ``frozen 1`` from ``cgroup.events``.
- ``terminate`` writes ``1`` to ``cgroup.kill`` (Linux >= 5.14) or, without it, SIGKILLs every pid in
  ``cgroup.procs``.
- `cgroup_v2_root` finds a writable cgroup v2 mount (pure ``/proc/self/mounts`` read).
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

from gpupool.adapters.pause.base import PauserBase, Step
from gpupool.core.pausers import Frees, PauseAction, PauseResult, Workload


def cgroup_v2_root(mounts: Path = Path("/proc/self/mounts")) -> Path | None:
    """The first cgroup2 mount point with a ``cgroup.freeze``-capable hierarchy, or None."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            root = Path(parts[1])
            if (root / "cgroup.procs").exists():
                return root
    return None


def own_cgroup(
    proc_cgroup: Path = Path("/proc/self/cgroup"), mounts: Path = Path("/proc/self/mounts")
) -> Path | None:
    """The cgroup v2 directory this process runs in (``0::<path>`` under the cgroup2 mount), or None."""
    root = cgroup_v2_root(mounts)
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::") and root is not None:
            return (root / line[3:].lstrip("/")).resolve()
    return None


def _frozen(cg: Path) -> bool:
    try:
        for line in (cg / "cgroup.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "frozen":
                return value.strip() == "1"
    except OSError:
        return False
    return False


class CgroupFreezerPauser(PauserBase):
    name = "cgroup"
    frees = Frees.COMPUTE
    vram_free_estimate_s = math.inf

    def check(self, workload: Workload) -> str | None:
        if not workload.cgroup:
            return "cgroup freezer needs the workload's cgroup path"
        cg = Path(workload.cgroup)
        if not cg.is_absolute():
            return f"cgroup path {workload.cgroup!r} must be absolute"
        if not (cg / "cgroup.freeze").exists():
            return f"{workload.cgroup} has no cgroup.freeze (not a cgroup v2 directory, or the root)"
        own = own_cgroup()
        if own is not None and (own == cg.resolve() or cg.resolve() in own.parents):
            return f"cgroup {workload.cgroup} holds the agent itself ({own}): refused"
        return None

    def pause(self, workload: Workload) -> PauseResult:
        return self._write(workload, "cgroup.freeze", "1", PauseAction.PAUSE)

    def resume(self, workload: Workload) -> PauseResult:
        return self._write(workload, "cgroup.freeze", "0", PauseAction.RESUME)

    def terminate(self, workload: Workload) -> PauseResult:
        cg = Path(workload.cgroup)
        if (cg / "cgroup.kill").exists():
            return self._write(workload, "cgroup.kill", "1", PauseAction.TERMINATE)
        return self._attempt(workload, PauseAction.TERMINATE, lambda: _kill_procs(cg))

    def is_paused(self, workload: Workload) -> bool:
        return bool(workload.cgroup) and _frozen(Path(workload.cgroup))

    def _write(self, workload: Workload, knob: str, value: str, action: PauseAction) -> PauseResult:
        def work() -> Step:
            try:
                (Path(workload.cgroup) / knob).write_text(value)
            except OSError as exc:
                return Step(ok=False, reason=f"write {value} to {knob}: {exc}")
            return Step(ok=True, reason=f"{knob}={value}")

        return self._attempt(workload, action, work)


def _kill_procs(cg: Path) -> Step:
    """SIGKILL every pid in ``cgroup.procs`` (kernels without ``cgroup.kill``)."""
    try:
        pids = [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except OSError as exc:
        return Step(ok=False, reason=f"cgroup.procs: {exc}")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return Step(ok=True, reason=f"SIGKILL to {len(pids)} pid(s)")
