"""`Evictor`: frees the device memory of a workload whose lease ended (preempted, revoked, expired),
and confirms from device readings that it came back.

Role: the agent's hand on a lease holder once the control plane took the lease away. Two paths:
- a VRAM-freeing pauser (``vllm-sleep``, ``cuda-checkpoint``): its ``pause`` runs off the tick thread;
  if it fails, or the memory is not back within ``grace_s``, the signal path follows;
- ``signal-kill``: SIGTERM (plus SIGCONT, so a job the agent had stopped can act on it) to the
  process group or pids, then SIGKILL once ``grace_s`` has passed and the
  job still holds memory;
- a Kubernetes pod: when the workload's labels name its pod (``gpupool.io/pod: <namespace>/<name>``)
  and an ``evict_pod`` hook is given (the Eviction API), the pod is evicted when the signal path
  starts, so kubelet stops its containers and the pod does not restart in place.
An eviction is *confirmed* when the device readings show the workload's processes holding at most
``residual_mib`` (0 for a killed job; a sleeping engine keeps its CUDA context) -- never on the word
of a signal or an HTTP answer. The result (`Freed`) carries ``freed_mib`` and the time taken.

Invariants:
- All state is touched on the agent's tick thread (`start`, `step`); only the pauser call runs on
  the executor passed in (``submit``), and its outcome is read in a later `step`.
- One eviction per lease id; `step` returns each eviction's `Freed` exactly once (confirmed, or
  ``ok=False`` after ``deadline_s``), and then forgets it.
- No signal ever goes to the agent's own process group or pid, or to its parent
  (`gpupool.adapters.pause.procfs.self_target`): such an eviction fails (``ok=False``) untouched.
- Time comes from the injected clock; the pids of a process group are resolved against the device's
  process list (``os.getpgid``), so a job's children are watched too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from gpupool.adapters.pause.procfs import self_target
from gpupool.agent.source import GpuSample
from gpupool.core.clock import Clock
from gpupool.core.pausers import Pauser, PauseResult, Workload

SIGNAL_KILL = "signal-kill"
POD_LABEL = "gpupool.io/pod"
"""Workload label naming its Kubernetes pod, ``<namespace>/<name>``."""
INLINE_ONLY = frozenset({"signal", "cgroup"})
"""Pausers that free no VRAM: their workloads go straight to the signal path."""


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    grace_s: float = 0.5
    """SIGTERM -> SIGKILL wait; also how long a finished freeing pause may take to show in readings."""
    deadline_s: float = 10.0
    """After this the eviction is reported failed (``ok=False``) and the waiting grant is not usable."""
    residual_mib: int = 1024
    """What a sleeping engine may keep (its CUDA context) and still count as freed."""

    def __post_init__(self) -> None:
        if not 0 <= self.grace_s <= self.deadline_s:
            raise ValueError(
                f"evict.grace_s: {self.grace_s!r} must be in [0, deadline_s={self.deadline_s!r}]"
            )
        if type(self.residual_mib) is not int or self.residual_mib < 0:
            raise ValueError(f"evict.residual_mib: {self.residual_mib!r} must be an integer >= 0")


@dataclass(frozen=True, slots=True)
class Freed:
    lease_id: str
    gpu_id: str
    path: str
    """``signal-kill`` or the freeing pauser's name (``vllm-sleep`` ...)."""
    ok: bool
    freed_mib: int
    held_mib: int
    """What the workload's processes still hold at the end (0 after a kill)."""
    elapsed_ms: float
    reason: str


@dataclass(slots=True)
class _Eviction:
    workload: Workload
    path: str
    started_s: float
    deadline_s: float
    held_start_mib: int
    pids: set[int] = field(default_factory=set)
    term_at_s: float | None = None
    killed: bool = False
    future: Future[PauseResult] | None = None
    pause_ok: bool | None = None
    notes: list[str] = field(default_factory=list)
    pod_evicted: bool = False
    refused: str = ""
    """Why the signal path must not run (its group or pids include the agent or its parent)."""


def pid_map(samples: Iterable[GpuSample]) -> dict[int, int]:
    """pid -> MiB it holds over all GPUs and MIG devices of one read."""
    out: dict[int, int] = {}
    for s in samples:
        for p in s.processes:
            out[p.pid] = out.get(p.pid, 0) + p.used_mib
        for inst in s.instances:
            for p in inst.processes:
                out[p.pid] = out.get(p.pid, 0) + p.used_mib
    return out


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class Evictor:
    def __init__(
        self,
        pausers: Mapping[str, Pauser],
        *,
        clock: Clock,
        submit: Callable[[Callable[[], PauseResult], str], Future[PauseResult]],
        policy: EvictionPolicy | None = None,
        evict_pod: Callable[[str, str], object] | None = None,
    ) -> None:
        self.pausers = pausers
        self.evict_pod = evict_pod
        """(namespace, name) -> evict that pod (raises on failure); None: pods are not evicted."""
        self.clock = clock
        self.submit = submit
        self.policy = policy or EvictionPolicy()
        self.grace_s = self.policy.grace_s
        self.deadline_s = self.policy.deadline_s
        self.residual_mib = self.policy.residual_mib
        self._active: dict[str, _Eviction] = {}

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._active

    def pending(self) -> dict[str, float]:
        """GPU id -> the latest deadline of the evictions still freeing memory on it."""
        out: dict[str, float] = {}
        for ev in self._active.values():
            gpu = ev.workload.gpu_id
            out[gpu] = max(out.get(gpu, 0.0), ev.deadline_s)
        return out

    # ------------------------------------------------------------------ start
    def start(self, workload: Workload, held: Mapping[int, int], now: float) -> str:
        """Begin freeing ``workload``'s memory (idempotent per lease id). ``held`` is `pid_map` of the
        latest read. Returns the path taken."""
        old = self._active.get(workload.lease_id)
        if old is not None:
            return old.path
        pids = self._pids(workload, held)
        ev = _Eviction(
            workload,
            SIGNAL_KILL,
            now,
            now + self.deadline_s,
            sum(held.get(p, 0) for p in pids),
            pids,
        )
        pauser = self.pausers.get(workload.pauser)
        freeing = (
            pauser is not None
            and workload.pauser not in INLINE_ONLY
            and pauser.frees.frees_vram
            and pauser.check(workload) is None
        )
        if freeing and pauser is not None:
            ev.path = workload.pauser
            fn = pauser.pause
            ev.future = self.submit(lambda: fn(workload), workload.endpoint)
        else:
            self._term(ev, now)
        self._active[workload.lease_id] = ev
        return ev.path

    @staticmethod
    def _pids(w: Workload, held: Mapping[int, int]) -> set[int]:
        pids = set(w.pids)
        if w.pgid is not None:
            pids.add(w.pgid)
            pids.update(p for p in held if _pgid_of(p) == w.pgid)
        return pids

    def _signal(self, ev: _Eviction, sig: signal.Signals) -> None:
        w = ev.workload
        try:
            if w.pgid is not None:
                os.killpg(w.pgid, sig)
            for pid in w.pids:
                if w.pgid is None or _pgid_of(pid) != w.pgid:
                    os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            ev.notes.append(f"{sig.name}: {exc}")

    def _evict_pod(self, ev: _Eviction) -> None:
        pod = dict(ev.workload.labels).get(POD_LABEL, "")
        if not pod or self.evict_pod is None or ev.pod_evicted:
            return
        ev.pod_evicted = True
        ns, sep, name = pod.partition("/")
        if not sep or not ns or not name:
            ev.notes.append(f"label {POD_LABEL}={pod!r}: not <namespace>/<name>")
            return
        try:
            self.evict_pod(ns, name)
        except Exception as exc:  # NOTE: the signal path still runs; the failure is reported
            ev.notes.append(f"pod {pod} eviction failed: {exc}")
            return
        ev.notes.append(f"pod {pod} evicted")

    def _term(self, ev: _Eviction, now: float) -> None:
        w = ev.workload
        self._evict_pod(ev)
        if w.pgid is None and not w.pids:
            ev.notes.append("no pgid or pids to signal")
            ev.term_at_s = now
            return
        refused = self_target(w.pgid, w.pids)
        if refused is not None:  # never signal the agent itself: report the eviction failed
            ev.refused = refused
            return
        self._signal(ev, signal.SIGTERM)
        self._signal(ev, signal.SIGCONT)  # a stopped job must run to act on SIGTERM
        ev.term_at_s = now
        if self.grace_s == 0:
            self._signal(ev, signal.SIGKILL)
            ev.killed = True

    # ------------------------------------------------------------------ step
    def step(self, held: Mapping[int, int], now: float) -> list[Freed]:
        """Advance every eviction against the latest readings (`pid_map`); return the finished ones."""
        done: list[Freed] = []
        for ev in list(self._active.values()):
            w = ev.workload
            if w.pgid is not None:  # children that appeared since the start
                ev.pids.update(p for p in held if p not in ev.pids and _pgid_of(p) == w.pgid)
            held_now = sum(held.get(p, 0) for p in ev.pids)
            if ev.future is not None and ev.future.done() and ev.pause_ok is None:
                exc = ev.future.exception()
                res = None if exc is not None else ev.future.result()
                ev.pause_ok = res is not None and res.ok
                if not ev.pause_ok:
                    why = f"{type(exc).__name__}: {exc}" if exc is not None else res.reason if res else ""
                    ev.notes.append(f"{w.pauser} failed: {why}")
            signalled = ev.path == SIGNAL_KILL or ev.term_at_s is not None
            if ev.refused:
                done.append(self._finish(ev, False, held_now, now, f"not signalled: {ev.refused}"))
                continue
            if signalled and not ev.pids and (w.pgid is None and not w.pids):
                done.append(self._finish(ev, False, held_now, now, "nothing to signal or watch"))
                continue
            if signalled:
                confirmed = held_now == 0
            else:
                confirmed = ev.pause_ok is True and held_now <= self.residual_mib
                if confirmed and not ev.pids:
                    ev.notes.append("no process of the workload on the device list to confirm by")
            if confirmed:
                done.append(self._finish(ev, True, held_now, now, "VRAM confirmed free"))
                continue
            if now >= ev.deadline_s:
                why = f"VRAM not confirmed free after {self.deadline_s:g} s: {held_now} MiB still held"
                done.append(self._finish(ev, False, held_now, now, why))
                continue
            if not signalled:
                waited = now - ev.started_s
                if ev.pause_ok is False or (ev.pause_ok is True and waited >= self.grace_s):
                    ev.notes.append(f"escalating to {SIGNAL_KILL}")
                    self._term(ev, now)
                elif waited >= max(self.grace_s, self._estimate(w)):
                    ev.notes.append(f"{w.pauser} still running after {waited:.3f} s: escalating")
                    self._term(ev, now)
            elif not ev.killed and ev.term_at_s is not None and now - ev.term_at_s >= self.grace_s:
                self._signal(ev, signal.SIGKILL)
                ev.killed = True
        for f in done:
            self._active.pop(f.lease_id, None)
        return done

    def _estimate(self, w: Workload) -> float:
        p = self.pausers.get(w.pauser)
        est = p.vram_free_estimate_s if p is not None else 0.0
        return est if est != float("inf") else 0.0

    def _finish(self, ev: _Eviction, ok: bool, held_now: int, now: float, why: str) -> Freed:
        steps = []
        if ev.term_at_s is not None:
            steps.append("SIGTERM")
        if ev.killed:
            steps.append("SIGKILL")
        detail = "; ".join([why, *([" -> ".join(steps)] if steps else []), *ev.notes])
        return Freed(
            ev.workload.lease_id,
            ev.workload.gpu_id,
            ev.path,
            ok,
            max(0, ev.held_start_mib - held_now),
            held_now,
            (now - ev.started_s) * 1000.0,
            detail,
        )
