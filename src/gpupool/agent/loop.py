"""`NodeAgent`: the per-node control loop. Each tick (200 ms by default, on an injected clock):

1. harvest pauser actions that finished off-thread, and the newest lease ledger from the gateway;
2. read every GPU from the `DeviceSource`; an NVML error or a device-level XID marks the GPU
   unhealthy once (its P2 workloads are terminated and their leases reported revoked);
3. turn the sample + engine metrics + ledger into a `Reading` (`gpupool.agent.pressure`) and feed the
   core `WatermarkBank`;
4. act in the same tick: PAUSE -> pause every P2 workload of that GPU with its own pauser; RESUME ->
   resume them; while PAUSED, pause newcomers and, once VRAM is still over the relief target after
   ``revoke_after_s``, revoke what cannot free VRAM in time (`gpupool.core.pausers.plan_relief`);
5. free the memory of holders whose ledger lease ended (preempted, revoked, expired: `Evictor`, when
   an ``eviction`` policy is given; the eviction starts in the tick that saw the lease go and is
   confirmed from device readings), and hold the higher-priority grants that arrived on that GPU as
   ``granted-pending-free`` until the memory is back (or their deadline passes);
6. bring the engines the gateway names (tidal standby instances) to the state it wants, asleep or
   awake, with their pauser (`gpupool.agent.standby`; the calls run off the tick thread);
7. publish a `NodeSnapshot` and the tick's `AgentEvent` values to the observers (gateway reporter,
   metrics).

Invariants:
- All agent state is touched on the tick thread only; slow pausers (HTTP, cuda-checkpoint) run on a
  worker pool and their `PauseResult` is applied at the next tick; the calls to one engine address
  run one at a time (`gpupool.agent.workers`), so a slow engine holds one worker, not all of them.
  ``inline_pausers`` (signals, freezer: one syscall / one write) act inside the tick that saw the
  crossing.
- The loop never waits for the gateway: enforcement is local, so an unreachable gateway changes
  nothing here (the reporter keeps an outbox and resynchronises).
- Event sequence numbers increase by one per event, starting at 1.
- A failure seen again at every tick, ledger read or retry (source, watermarks, an unreadable lease,
  MPS limits, a failing pause) is reported when it starts and when it clears, with a reminder at
  most once a minute in between (`gpupool.agent.repeats`), not once per occurrence.
- `run` outlives a tick that raises: the thread that enforces the watermarks never ends silently
  while the process (and its reporter) live on.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gpupool.agent.evict import EvictionPolicy, Evictor, Freed, pid_map
from gpupool.agent.pressure import health_problem, relief_candidates, to_reading, within_capacity
from gpupool.agent.repeats import Repeats
from gpupool.agent.source import DeviceSource, GpuSample
from gpupool.agent.standby import EngineSleeps
from gpupool.agent.values import (
    AgentConfig,
    AgentEvent,
    EngineSource,
    GpuStatus,
    LedgerFeed,
    MpsSync,
    NodeSnapshot,
    Observer,
)
from gpupool.agent.workers import KeyedPool, engine_key
from gpupool.agent.workloads import Entry, RunState, WorkloadTable, workload_from_lease
from gpupool.core.clock import Clock
from gpupool.core.pausers import (
    PauseAction,
    Pauser,
    PauseResult,
    ReliefStep,
    Workload,
    plan_relief,
    vram_deficit_mib,
)
from gpupool.core.watermarks import Reading, Signal, WatermarkBank, WatermarkConfig

__all__ = ["AgentConfig", "AgentEvent", "GpuStatus", "NodeAgent", "NodeSnapshot", "Observer"]

log = logging.getLogger("gpupool.agent")

INLINE_PAUSERS = frozenset({"signal", "cgroup"})
GRANTED_PENDING_FREE = "granted-pending-free"
FREE_FAILED = "free-failed"


@dataclass(frozen=True, slots=True)
class _Probe:
    lease_id: str
    paused: bool


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        source: DeviceSource,
        pausers: Mapping[str, Pauser],
        *,
        clock: Clock,
        engines: EngineSource | None = None,
        ledger: LedgerFeed | None = None,
        mps: MpsSync | None = None,
        inline_pausers: frozenset[str] = INLINE_PAUSERS,
        eviction: EvictionPolicy | None = None,
        evict_pod: Callable[[str, str], object] | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.pausers = dict(pausers)
        self.clock = clock
        self.engines = engines
        self.ledger = ledger
        self.mps = mps
        self.inline_pausers = inline_pausers
        self.bank = WatermarkBank(config.watermarks)
        self.workloads = WorkloadTable()
        self.observers: list[Observer] = []
        self.unhealthy: dict[str, str] = {}
        self.ledger_mib: dict[str, int] = {}
        self._pressure_since: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._failed: dict[str, str] = {}
        """lease id -> why its last pause failed (then relief no longer trusts its pauser)."""
        self._events: list[AgentEvent] = []
        self._seq = 0
        self.repeats = Repeats(self._emit)
        """Failures seen at every tick, ledger read or retry: reported when they start and clear."""
        self._tick = 0
        self.last_tick_s: float | None = None
        self.tick_errors = 0
        self._pool: KeyedPool | None = None
        self._inflight: list[Future[PauseResult | _Probe]] = []
        self._last: NodeSnapshot = NodeSnapshot(config.node, clock.now(), 0, (), ())
        self.evictor: Evictor | None = (
            None
            if eviction is None
            else Evictor(
                self.pausers, clock=clock, submit=self._submit_any, policy=eviction, evict_pod=evict_pod
            )
        )
        self.engine_sleeps = EngineSleeps(
            self.pausers, submit=self._submit_any, emit=self._emit, blocked=self._freeing
        )
        self._to_evict: list[str] = []
        self._ledger_seen: set[str] = set()
        self.grants: dict[str, tuple[str, float, str, int]] = {}
        """Lease id -> (GPU id, since_s, state, vram_mib) of grants not yet usable:
        ``granted-pending-free``, or ``free-failed`` once the memory was not back by the deadline."""
        target = config.relief_target if config.relief_target is not None else config.watermarks.vram_high
        self._target = target

    # ------------------------------------------------------------------ public
    def register(self, workload: Workload) -> Entry:
        """Add a P2 workload; if its GPU is paused it is paused on the next tick. A new workload's
        real state is probed (`Pauser.is_paused`), so a restarted agent adopts jobs it had paused
        and resumes them once their GPU is calm."""
        return self._register(workload, source="local", now=self.clock.now())

    def _register(self, workload: Workload, *, source: str, now: float) -> Entry:
        new = self.workloads.get(workload.lease_id) is None
        e = self.workloads.register(workload, source=source, at_s=now)
        if new:
            self._probe(e)
        return e

    def _probe(self, e: Entry) -> None:
        w = e.workload
        pauser = self.pausers.get(w.pauser)
        if pauser is None or pauser.check(w) is not None:
            return
        if w.pauser in self.inline_pausers:
            self._adopt(_Probe(w.lease_id, pauser.is_paused(w)))
            return

        def probe() -> _Probe:
            return _Probe(w.lease_id, pauser.is_paused(w))

        self._inflight.append(self._submit_any(probe, w.endpoint))

    def _adopt(self, p: _Probe) -> None:
        e = self.workloads.get(p.lease_id)
        if p.paused and e is not None and e.state is RunState.RUNNING:
            self.workloads.set_state(p.lease_id, RunState.PAUSED, at_s=self.clock.now())

    def snapshot(self) -> NodeSnapshot:
        return self._last

    def tick(self) -> NodeSnapshot:
        now = self.clock.now()
        self._tick += 1
        self._harvest()
        self._sync_ledger(now)
        try:
            samples = self.source.read()
            self.repeats.clear(("source",), now)
        except Exception as exc:  # a broken source must not kill the loop; report and retry
            self.repeats.fail(("source",), "source_error", now, reason=f"{type(exc).__name__}: {exc}")
            samples = ()
        statuses: list[GpuStatus] = []
        for s in samples:
            statuses.append(self._gpu_tick(s, now))
        if self.evictor is not None:
            self._evict_tick(samples, now)
        if self.engine_sleeps.engines:
            self.engine_sleeps.step(now)
        supervise = getattr(self.mps, "supervise", None)
        if callable(supervise):  # MPS daemons (gpupool.agent.mps.MpsSupervisor)
            for n in supervise(samples, now):
                self._emit(
                    n.kind,
                    now,
                    gpu_id=n.gpu_id,
                    lease_id=n.lease_id,
                    reason=n.detail,
                    latency_ms=n.latency_ms,
                )
        snap = NodeSnapshot(
            self.config.node,
            now,
            self._tick,
            tuple(statuses),
            tuple((e.workload.lease_id, e.workload.gpu_id, e.state.value) for e in self.workloads.entries())
            + tuple((lid, g[0], g[2]) for lid, g in sorted(self.grants.items())),
        )
        self._last = snap
        self.last_tick_s = self.clock.now() - now
        self._publish(snap)
        return snap

    def _publish(self, snap: NodeSnapshot) -> None:
        events, self._events = self._events, []
        for obs in self.observers:
            obs(snap, events)

    def run(self, stop: threading.Event, *, sleep: Callable[[float], object] | None = None) -> None:
        """Tick every ``period_s`` until ``stop`` is set. A late tick is not made up for (no bursts).
        A tick that raises (a bug, an observer, input no check foresaw) is counted in `tick_errors`
        and logged (the 1st, 2nd, 4th, 8th ... time), and the next tick runs as planned."""
        wait = sleep or stop.wait
        period = self.config.period_s
        next_at = self.clock.now()
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                self.tick_errors += 1
                if self.tick_errors & (self.tick_errors - 1) == 0:
                    log.exception(
                        "tick %d failed (%d so far); the loop goes on", self._tick, self.tick_errors
                    )
            next_at += period
            now = self.clock.now()
            next_at = max(next_at, now)
            wait(next_at - now)

    def drain(self, timeout_s: float = 30.0) -> None:
        """Wait for off-thread pauser actions and apply their results (tests, shutdown)."""
        for f in list(self._inflight):
            f.exception(timeout=timeout_s)
        for e in self.engine_sleeps.engines.values():
            if e.future is not None:
                e.future.exception(timeout=timeout_s)
        self._harvest()
        if self._events:
            self._publish(self._last)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    # ------------------------------------------------------------------ per GPU
    def _gpu_tick(self, s: GpuSample, now: float) -> GpuStatus:
        gpu = s.gpu_id
        s, bad = within_capacity(s)
        self.repeats.update(("reading", gpu), "source_error", now, bad, gpu_id=gpu)
        problem = health_problem(s)
        if problem and gpu not in self.unhealthy:
            self._mark_unhealthy(gpu, problem, now)
        if gpu in self.unhealthy:
            return GpuStatus(s, None, self.bank.is_paused(gpu), False, self.unhealthy[gpu])
        views = self.engines.views(gpu, now) if self.engines is not None else ()
        reading = to_reading(
            s, at_s=now, engines=views, ledger_mib=self.ledger_mib.get(gpu, 0), cfg=self.config.pressure
        )
        t = self.bank.feed(reading)
        if t is not None:
            if t.signal is Signal.PAUSE:
                self._pressure_since[gpu] = now
                self._emit("watermark_pause", now, gpu_id=gpu, reason=t.reason)
            else:
                self._pressure_since.pop(gpu, None)
                self._emit("watermark_resume", now, gpu_id=gpu, reason=t.reason)
        if self.bank.is_paused(gpu):
            self._enforce(s, reading, now)
        else:
            self._resume_gpu(gpu, now)
        return GpuStatus(s, reading, self.bank.is_paused(gpu), True)

    def _enforce(self, sample: GpuSample, reading: Reading, now: float) -> None:
        gpu = sample.gpu_id
        entries = self.workloads.on_gpu(gpu)
        if not entries:
            return
        revoke_after = self.config.revoke_after_s
        since = self._pressure_since.get(gpu, now)
        if revoke_after is not None and now - since >= revoke_after:
            deficit = vram_deficit_mib(
                reading.vram_used_mib, reading.vram_total_mib, target_ratio=self._target
            )
            if deficit > 0:
                # Budget = the whole window since the crossing: a pauser declared to free VRAM within
                # it is trusted while it works (a failed one is not, see relief_candidates).
                cands = relief_candidates(entries, sample, self.pausers, self._failed)
                for d in plan_relief(cands, deficit_mib=deficit, budget_s=revoke_after):
                    if d.step is ReliefStep.REVOKE:
                        e = self.workloads.get(d.lease_id)
                        if e is not None:
                            self._revoke(e, d.reason, now)
        for e in self.workloads.on_gpu(gpu):
            if e.state is RunState.RUNNING and self._retry_at.get(e.workload.lease_id, -math.inf) <= now:
                self._start(e, PauseAction.PAUSE, now)

    def _resume_gpu(self, gpu: str, now: float) -> None:
        if not self.workloads.has_paused(gpu):
            return
        for e in reversed(self.workloads.on_gpu(gpu)):  # most urgent first
            if e.state is RunState.PAUSED and self._retry_at.get(e.workload.lease_id, -math.inf) <= now:
                self._start(e, PauseAction.RESUME, now)

    def _mark_unhealthy(self, gpu: str, problem: str, now: float) -> None:
        self.unhealthy[gpu] = problem
        self._emit("unhealthy", now, gpu_id=gpu, reason=problem)
        for e in self.workloads.on_gpu(gpu):
            self._revoke(e, f"GPU {gpu} unhealthy: {problem}", now)

    # ------------------------------------------------------------------ actions
    def _start(self, e: Entry, action: PauseAction, now: float) -> None:
        w = e.workload
        pauser = self.pausers.get(w.pauser)
        if pauser is None:
            self._retry_at[w.lease_id] = math.inf  # reported once; relief may still revoke it
            self._emit(
                "pauser_failure",
                now,
                gpu_id=w.gpu_id,
                lease_id=w.lease_id,
                pauser=w.pauser,
                reason=f"unknown pauser {w.pauser!r}",
            )
            return
        self.workloads.set_state(
            w.lease_id, RunState.PAUSING if action is PauseAction.PAUSE else RunState.RESUMING, at_s=now
        )
        fn = pauser.pause if action is PauseAction.PAUSE else pauser.resume
        if w.pauser in self.inline_pausers:
            self._apply(fn(w))
            return
        self._inflight.append(self._submit_any(lambda: fn(w), w.endpoint))

    def _freeing(self, gpu_id: str) -> bool:
        """Memory on ``gpu_id`` is still being freed (an eviction there is not confirmed yet)."""
        return self.evictor is not None and (
            gpu_id in self.evictor.pending()
            or any(
                e is not None and e.workload.gpu_id == gpu_id for e in map(self.workloads.get, self._to_evict)
            )
        )

    def _submit_any(self, fn: Callable[[], Any], endpoint: str = "") -> Future[Any]:
        """Run a pauser call off the tick thread; the calls to one engine address run one at a time."""
        if self._pool is None:
            self._pool = KeyedPool(self.config.workers)
        return self._pool.submit(fn, engine_key(endpoint))

    def _harvest(self) -> None:
        if not self._inflight:
            return
        done = [f for f in self._inflight if f.done()]
        self._inflight = [f for f in self._inflight if not f.done()]
        for f in done:
            exc = f.exception()
            if exc is not None:  # a pauser broke its contract; record it, do not crash the loop
                self._emit("pauser_failure", self.clock.now(), reason=f"{type(exc).__name__}: {exc}")
                continue
            res = f.result()
            if isinstance(res, _Probe):
                self._adopt(res)
            else:
                self._apply(res)

    def _apply(self, r: PauseResult) -> None:
        now = self.clock.now()
        e = self.workloads.get(r.lease_id)
        if e is None or e.state is RunState.REVOKED:
            return
        gpu = e.workload.gpu_id
        kind = "paused" if r.action is PauseAction.PAUSE else "resumed"
        if not r.ok:
            back = RunState.RUNNING if r.action is PauseAction.PAUSE else RunState.PAUSED
            self.workloads.set_state(r.lease_id, back, at_s=now, vram_freed=e.vram_freed)
            # A refusal does not change by retrying (MIG, NCCL, missing binary): do not retry it.
            self._retry_at[r.lease_id] = math.inf if r.refused else now + self.config.retry_s
            if r.action is PauseAction.PAUSE:
                self._failed[r.lease_id] = f"last pause failed: {r.reason}"
            self.repeats.fail(
                ("pauser", r.lease_id),
                "pauser_failure",
                now,
                gpu_id=gpu,
                lease_id=r.lease_id,
                pauser=r.pauser,
                frees=r.frees.value,
                reason=f"{r.action}: {r.reason}",
                latency_ms=r.latency_ms,
            )
            return
        self._retry_at.pop(r.lease_id, None)
        self._failed.pop(r.lease_id, None)
        self.repeats.clear(("pauser", r.lease_id), now)
        if r.action is PauseAction.PAUSE:
            self.workloads.set_state(r.lease_id, RunState.PAUSED, at_s=now, vram_freed=r.frees.frees_vram)
        else:
            self.workloads.set_state(r.lease_id, RunState.RUNNING, at_s=now)
        self._emit(
            kind,
            now,
            gpu_id=gpu,
            lease_id=r.lease_id,
            pauser=r.pauser,
            frees=r.frees.value,
            reason=r.reason,
            latency_ms=r.latency_ms,
        )
        # The GPU may have changed state while an off-thread action ran: converge.
        if r.action is PauseAction.PAUSE and not self.bank.is_paused(gpu) and gpu not in self.unhealthy:
            self._start(e, PauseAction.RESUME, now)

    def _revoke(self, e: Entry, reason: str, now: float) -> None:
        w = e.workload
        pauser = self.pausers.get(w.pauser)
        result = pauser.terminate(w) if pauser is not None else None
        self.workloads.set_state(w.lease_id, RunState.REVOKED, at_s=now)
        self.repeats.forget(("pauser", w.lease_id))
        detail = reason if result is None or result.ok else f"{reason} (terminate: {result.reason})"
        self._emit("revoke", now, gpu_id=w.gpu_id, lease_id=w.lease_id, pauser=w.pauser, reason=detail)

    # ------------------------------------------------------------------ ledger
    def _sync_ledger(self, now: float) -> None:
        if self.ledger is None:
            return
        take_wm = getattr(self.ledger, "take_watermarks", None)
        wm = take_wm() if callable(take_wm) else None
        if wm is not None:
            self._apply_watermarks(wm, now)
        take_eng = getattr(self.ledger, "take_engines", None)
        engines = take_eng() if callable(take_eng) else None
        if engines is not None:
            self.engine_sleeps.take(engines, now)
        leases = self.ledger.take_ledger()
        if leases is None:
            return
        mib: dict[str, int] = {}
        seen: set[str] = set()
        bad: set[object] = set()
        for lease in leases:
            gpu = str(lease.get("gpu_id", ""))
            vram = lease.get("vram_mib", 0)
            if gpu and type(vram) is int:
                mib[gpu] = mib.get(gpu, 0) + vram
            try:
                w = workload_from_lease(lease)
            except ValueError as exc:  # reported once while the ledger keeps the lease so
                lid = str(lease.get("lease_id", ""))
                bad.add(("ledger", lid))
                self.repeats.fail(("ledger", lid), "pauser_failure", now, lease_id=lid, reason=str(exc))
                continue
            if w is not None and w.priority < 0:
                seen.add(w.lease_id)
                self._register(w, source="ledger", now=now)
        self.repeats.clear_all(now, kind_of_key="ledger", keep=bad)
        self.ledger_mib = mib
        for lease_id in self.workloads.ledger_ids() - seen:
            if self.evictor is None:
                self.workloads.forget(lease_id)
            elif lease_id not in self.evictor and lease_id not in self._to_evict:
                self._to_evict.append(lease_id)  # started after this tick's read, in this tick
        if self.evictor is not None:
            self._hold_new_grants(leases, now)
        if self.mps is not None:
            for kind, gpu, detail in self.mps.sync(leases):
                if kind == "mps_failure":  # retried with every ledger read
                    self.repeats.fail(("mps", gpu), kind, now, gpu_id=gpu, reason=detail)
                    continue
                self.repeats.clear(("mps", gpu), now)
                self._emit(kind, now, gpu_id=gpu, reason=detail)

    # ------------------------------------------------------------------ eviction
    def _hold_new_grants(self, leases: Sequence[Mapping[str, object]], now: float) -> None:
        """A grant that is new in this ledger, on a GPU whose memory is still being freed, is
        ``granted-pending-free`` until the evictions there are confirmed."""
        assert self.evictor is not None
        busy = self.evictor.pending()
        gone = {e.workload.gpu_id for lid in self._to_evict if (e := self.workloads.get(lid))}
        ids: set[str] = set()
        for lease in leases:
            lid, gpu, prio = (
                str(lease.get("lease_id", "")),
                str(lease.get("gpu_id", "")),
                lease.get("priority", 0),
            )
            ids.add(lid)
            if lid in self._ledger_seen or type(prio) is not int or prio < 0:
                continue
            if gpu in busy or gpu in gone:
                deadline_s = busy.get(gpu, now + self.evictor.policy.deadline_s) - now
                vram = lease.get("vram_mib", 0)
                self.grants[lid] = (gpu, now, GRANTED_PENDING_FREE, vram if type(vram) is int else 0)
                why = f"{GRANTED_PENDING_FREE}: memory on {gpu} being freed, deadline in {deadline_s:.1f} s"
                self._emit("grant_pending_free", now, gpu_id=gpu, lease_id=lid, reason=why)
        self._ledger_seen = ids
        for lid in [k for k in self.grants if k not in ids]:
            del self.grants[lid]  # the grant itself ended

    def grant_state(self, lease_id: str) -> str:
        """``granted-pending-free`` while the grant waits for memory to come back, ``free-failed`` when
        that missed its deadline, else ``usable``."""
        g = self.grants.get(lease_id)
        return "usable" if g is None else g[2]

    def _evict_tick(self, samples: Sequence[GpuSample], now: float) -> None:
        assert self.evictor is not None
        held = pid_map(samples)
        for lid in self._to_evict:
            e = self.workloads.get(lid)
            if e is None:
                continue
            path = self.evictor.start(e.workload, held, now)
            self.workloads.set_state(lid, RunState.REVOKED, at_s=now)
            self._emit(
                "evict", now, gpu_id=e.workload.gpu_id, lease_id=lid, pauser=path, reason="lease ended"
            )
        self._to_evict = []
        for f in self.evictor.step(held, now):
            self._freed(f, now)
        if self.grants:
            self._settle_grants(samples, now)

    def _settle_grants(self, samples: Sequence[GpuSample], now: float) -> None:
        """A waiting grant becomes usable once no eviction is pending on its GPU and the device shows
        room for it (free >= the waiting grants' VRAM); at the deadline it is ``free-failed``."""
        assert self.evictor is not None
        pending = self.evictor.pending()
        free = {s.gpu_id: s.vram_total_mib - s.vram_used_mib for s in samples if not s.error}
        want: dict[str, int] = {}
        for gpu, _since, state, vram in self.grants.values():
            if state == GRANTED_PENDING_FREE:
                want[gpu] = want.get(gpu, 0) + vram
        for lid, (gpu, since, state, vram) in list(self.grants.items()):
            if state != GRANTED_PENDING_FREE:
                continue
            if gpu not in pending and free.get(gpu, -1) >= want[gpu]:
                del self.grants[lid]
                self._emit("grant_usable", now, gpu_id=gpu, lease_id=lid, latency_ms=(now - since) * 1000.0)
            elif now - since >= self.evictor.policy.deadline_s:
                self.grants[lid] = (gpu, since, FREE_FAILED, vram)
                why = f"{free.get(gpu, 0)} MiB free of the {want[gpu]} MiB granted after the deadline"
                self._emit("grant_free_failed", now, gpu_id=gpu, lease_id=lid, reason=why)

    def _freed(self, f: Freed, now: float) -> None:
        self.workloads.forget(f.lease_id)
        self._emit(
            "vram_freed" if f.ok else "evict_failed",
            now,
            gpu_id=f.gpu_id,
            lease_id=f.lease_id,
            pauser=f.path,
            reason=f"freed_mib={f.freed_mib} held_mib={f.held_mib}: {f.reason}",
            latency_ms=f.elapsed_ms,
        )

    def _apply_watermarks(self, raw: Mapping[str, object], now: float) -> None:
        """New thresholds from the gateway apply from this tick; states are kept (no flapping)."""
        fields = ("vram_high", "vram_low", "temp_high_c", "temp_low_c", "early_warning")
        try:
            cfg = WatermarkConfig(**{k: raw[k] for k in fields if k in raw})  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            why = f"gateway watermarks {dict(raw)!r}: {exc}"
            self.repeats.fail(("watermarks",), "config_error", now, reason=why)
            return
        self.repeats.clear(("watermarks",), now)
        if cfg != self.bank.config:
            self.bank.reconfigure(cfg)
            if self.config.relief_target is None:
                self._target = cfg.vram_high
            self._emit("watermarks", now, reason=f"high {cfg.vram_high:.0%} low {cfg.vram_low:.0%}")

    def _emit(self, kind: str, at_s: float, **fields: object) -> None:
        self._seq += 1
        self._events.append(AgentEvent(self._seq, kind, at_s, **fields))  # type: ignore[arg-type]
