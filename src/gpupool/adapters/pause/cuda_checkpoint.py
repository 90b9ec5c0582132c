"""`CudaCheckpointPauser`: ``cuda-checkpoint --toggle --pid P`` moves a process's device memory to
host RAM and releases its GPU (`Frees.COMPUTE_AND_VRAM`); the same call brings it back.

Role: the heavy pauser for jobs that are not vLLM engines. It is only offered when `detect` finds
the binary (on PATH or configured) *and* a driver >= R550 (gpu-facts 5.1); the detection result is a
value the agent reports, never an assumption.

Invariants:
- `check` refuses, with the reason, before touching anything: no binary, old or unknown driver,
  not x86-64, a MIG slice (checkpoint fails with "out of memory", NVIDIA/cuda-checkpoint#42), a
  multi-process NCCL job (known limitation, #30), or no pids.
- Every CUDA process of the job is toggled (a TP engine has one per GPU, #39), in pid order; the
  first failure stops the sequence and is reported.
- Subprocesses run with a timeout (toggling waits for queued kernels and copies VRAM over PCIe:
  seconds to minutes), so the agent runs this pauser off the control-loop thread.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpupool.adapters.pause.base import PauserBase, Step
from gpupool.core.clock import Clock
from gpupool.core.pausers import Frees, PauseAction, PauseResult, Workload

MIN_DRIVER_MAJOR = 550
"""``--toggle`` needs the driver's checkpoint support (R550+)."""
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
_VERSION_RE = re.compile(r"\b(\d{3})\.(\d+)(?:\.(\d+))?\b")


@dataclass(frozen=True, slots=True)
class CheckpointSupport:
    """What `detect` found. ``reason`` explains ``available=False``."""

    available: bool
    binary: str
    driver_version: str
    reason: str


def driver_version(version_file: Path = DRIVER_VERSION_FILE) -> str:
    """The NVIDIA kernel-module version (``550.54.14``) from ``/proc/driver/nvidia/version``, or ''."""
    try:
        text = version_file.read_text()
    except OSError:
        return ""
    m = _VERSION_RE.search(text)
    return m.group(0) if m else ""


def detect(
    *, binary: str = "cuda-checkpoint", version_file: Path = DRIVER_VERSION_FILE, machine: str = ""
) -> CheckpointSupport:
    path = shutil.which(binary) or ""
    version = driver_version(version_file)
    arch = machine or platform.machine()
    if not path:
        return CheckpointSupport(False, "", version, f"{binary!r} not found on PATH")
    if arch not in ("x86_64", "AMD64"):
        return CheckpointSupport(False, path, version, f"cuda-checkpoint supports x86-64 only, not {arch}")
    if not version:
        return CheckpointSupport(
            False, path, "", f"NVIDIA driver version unknown ({version_file} unreadable)"
        )
    if int(version.split(".")[0]) < MIN_DRIVER_MAJOR:
        return CheckpointSupport(
            False,
            path,
            version,
            f"driver {version} is older than R{MIN_DRIVER_MAJOR} (no checkpoint support)",
        )
    return CheckpointSupport(True, path, version, f"cuda-checkpoint {path} with driver {version}")


class CudaCheckpointPauser(PauserBase):
    name = "cuda-checkpoint"
    frees = Frees.COMPUTE_AND_VRAM

    def __init__(
        self,
        *,
        support: CheckpointSupport | None = None,
        clock: Clock | None = None,
        timeout_s: float = 120.0,
        vram_free_estimate_s: float = 15.0,
    ) -> None:
        super().__init__(clock=clock)
        self.support = support or detect()
        self._timeout_s = timeout_s
        self.vram_free_estimate_s = vram_free_estimate_s

    def check(self, workload: Workload) -> str | None:
        if not self.support.available:
            return f"cuda-checkpoint unavailable: {self.support.reason}"
        if workload.on_mig:
            return "cuda-checkpoint does not support MIG slices (checkpoint fails with out of memory, #42)"
        if workload.nccl_world_size > 1:
            return (
                f"cuda-checkpoint does not support multi-process NCCL jobs "
                f"(world size {workload.nccl_world_size}, #30)"
            )
        if not workload.pids:
            return "cuda-checkpoint needs the pids of the job's CUDA processes"
        return None

    def _run(self, *args: str) -> tuple[bool, str]:
        try:
            proc = subprocess.run(
                [self.support.binary, *args],
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{' '.join(args)}: {type(exc).__name__}: {exc}"
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            return False, f"{' '.join(args)}: exit {proc.returncode}: {out[:200]}"
        return True, out

    def state(self, pid: int) -> str:
        """``running`` / ``checkpointed`` / ``locked`` / ... as the binary prints it, or '' on error."""
        ok, out = self._run("--get-state", "--pid", str(pid))
        return out.strip().lower() if ok else ""

    def _toggle(self, workload: Workload, action: PauseAction, want: str) -> PauseResult:
        def work() -> Step:
            done = 0
            for pid in sorted(workload.pids):
                if self.state(pid) == want:
                    continue
                ok, out = self._run("--toggle", "--pid", str(pid))
                if not ok:
                    return Step(ok=False, reason=f"pid {pid}: {out} ({done} toggled)")
                done += 1
            freed = workload.vram_mib if action is PauseAction.PAUSE else 0
            return Step(ok=True, reason=f"toggled {done} process(es)", vram_freed_mib=freed)

        return self._attempt(workload, action, work)

    def pause(self, workload: Workload) -> PauseResult:
        return self._toggle(workload, PauseAction.PAUSE, "checkpointed")

    def resume(self, workload: Workload) -> PauseResult:
        return self._toggle(workload, PauseAction.RESUME, "running")

    def terminate(self, workload: Workload) -> PauseResult:
        return self._declined(
            workload,
            PauseAction.TERMINATE,
            "cuda-checkpoint does not end jobs; use the signal or cgroup pauser's terminate",
        )

    def is_paused(self, workload: Workload) -> bool:
        return bool(workload.pids) and all(self.state(p) == "checkpointed" for p in workload.pids)
