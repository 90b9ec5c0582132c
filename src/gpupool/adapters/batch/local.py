"""Local subprocess executor: each job is a child process in its own session (process group).

The child dies with the process that started it (Linux ``PR_SET_PDEATHSIG``: SIGKILL when the
starting thread's process ends, a SIGKILL of the gateway included): a job is never left running
unowned while the next gateway or leader requeues it (its children that left the group are not
covered). Pause is SIGSTOP to the group (frees CPU and stops new kernel launches; VRAM stays: gpu-facts 5.2),
resume is SIGCONT, stop is SIGTERM then SIGKILL after ``grace_s``. `LocalHandle.terminate` sends
SIGTERM and returns at once: a daemon thread waits out the grace period and sends SIGKILL, so the
caller (the gateway's event loop) never waits for a job that ignores SIGTERM; `LocalHandle.poll`
says when the process is gone. The job sees its lease in the
environment (``GPUPOOL_LEASE_ID``, ``GPUPOOL_JOB_ID``, ``GPUPOOL_VRAM_MIB``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

from gpupool.core.tidal.jobs import BatchJobSpec

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a child that gets SIGKILL when the process that started it dies (``prctl
    PR_SET_PDEATHSIG``), so a gateway killed with SIGKILL leaves no job running that the next
    gateway (or leader) requeues and starts again; elsewhere None (no such call)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def set_pdeathsig() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return set_pdeathsig


class LocalHandle:
    def __init__(self, spec: BatchJobSpec, *, lease_id: str, env: Mapping[str, str] | None = None) -> None:
        full = dict(os.environ if env is None else env)
        full.update(
            {"GPUPOOL_LEASE_ID": lease_id, "GPUPOOL_JOB_ID": spec.id, "GPUPOOL_VRAM_MIB": str(spec.vram_mib)}
        )
        self.spec = spec
        self._killer: threading.Thread | None = None
        self.proc = subprocess.Popen(
            list(spec.command),
            env=full,
            start_new_session=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 (one prctl call, resolved before the fork)
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def pause(self) -> bool:
        return self._signal(signal.SIGSTOP)

    def resume(self) -> bool:
        return self._signal(signal.SIGCONT)

    def terminate(self, *, grace_s: float = 2.0) -> None:
        """SIGCONT + SIGTERM to the group now; SIGKILL from a daemon thread if the process is still
        there after ``grace_s``. Returns at once (a second call changes nothing)."""
        if self._killer is not None or self.proc.poll() is not None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        self._killer = threading.Thread(
            target=self._kill_after, args=(grace_s,), name=f"batch-stop-{self.proc.pid}", daemon=True
        )
        self._killer.start()

    def _kill_after(self, grace_s: float) -> None:
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)

    def stop(self, *, grace_s: float = 2.0) -> int:
        """`terminate`, then wait until the process is gone; its exit status."""
        self.terminate(grace_s=grace_s)
        return self.proc.wait()

    def _signal(self, sig: signal.Signals) -> bool:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True


class LocalExecutor:
    """Starts `LocalHandle` processes for ``command`` jobs."""

    name = "local"

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = env

    def accepts(self, spec: BatchJobSpec) -> bool:
        return bool(spec.command)

    def start(self, spec: BatchJobSpec, *, lease_id: str) -> LocalHandle:
        return LocalHandle(spec, lease_id=lease_id, env=self._env)


def wait_for(predicate: object, timeout_s: float = 10.0) -> bool:
    """Poll a zero-argument callable until it returns truthy (test and CLI helper)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.02)
    return False
