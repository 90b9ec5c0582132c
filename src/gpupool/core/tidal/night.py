"""`NightRepartitioner`: NIGHT MIG re-partition of named GPUs through the node actuator, and back.

Role: the control plane's driver of `gpupool.core.tidal.partition` plans. For each GPU named in
``repartition_gpus`` it merges the GPU's instances into one large batch instance at NIGHT and puts
the day layout back before DAY, in this order (both ways):

1. check: every lease on the GPU is P2 (online work refuses the plan: `plan_merge`'s `Refusal`);
2. drain: its standby engines are stopped (`Standby` port: it notes what to bring back), the GPU
   takes no new leases and its P2 leases are revoked (their holders pause or requeue: the batch
   runner sees the lease end);
3. apply: the node's `LayoutActuator` (NVML calls, on real or simulated devices) destroys and
   creates the instances; its ``busy`` hook is asked for leases still on them (none after 2.);
4. sync: the GPU's slices in the ledger become what the node now holds (`discover`), the rest of
   the node is left exactly as it is; the GPU is undrained; on restore the standby engines start.

A failed apply leaves the ledger's slices as they were (the actuator changed nothing it could not
read back), undrains the GPU and restarts the standby engines: the GPU keeps its day layout.
Durations are measured with the injected clock (`TidalPlane.repartition_s` plans the restore lead
from them). Standard library only; no clock reads of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from gpupool.core.clock import Clock
from gpupool.core.controller import LeaseController
from gpupool.core.tidal.partition import Refusal, RepartitionPlan, plan_merge
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migactuate import ApplyOutcome
from gpupool.hardware.slices import Slice, SliceKind


class LayoutActuator(Protocol):
    """A `MigActuator` that also reads a GPU's layout back (`NvmlMigActuator`)."""

    name: str

    def current(self, index: int) -> tuple[MigInstance, ...]: ...

    def apply(self, node: str, wanted: Mapping[int, Sequence[MigInstance]]) -> ApplyOutcome: ...


class Standby(Protocol):
    """Stops the standby engines on a GPU before it is re-partitioned, and starts them after."""

    def stop(self, gpu_id: str) -> object:
        """Stop them; returns what ``start`` needs to bring them back."""
        ...

    def start(self, gpu_id: str, stopped: object) -> None: ...


@dataclass(slots=True)
class GpuNight:
    gpu_id: str
    state: str = "day"
    """``day`` | ``merged`` | ``refused`` | ``failed``."""
    detail: str = ""
    plan: RepartitionPlan | None = None
    stopped: object = None
    last_s: float | None = None


class NightRepartitioner:
    def __init__(
        self,
        controller: LeaseController,
        *,
        gpus: Sequence[str],
        actuator_of: Callable[[str], LayoutActuator],
        discover: Callable[[str], Sequence[Slice]],
        clock: Clock,
        standby: Standby | None = None,
        target_profiles: Sequence[str] = ("7g.80gb",),
    ) -> None:
        self.c = controller
        self.gpus = {g: GpuNight(g) for g in gpus}
        self.actuator_of = actuator_of
        self.discover = discover
        self.clock = clock
        self.standby = standby
        self.target_profiles = tuple(target_profiles)
        self.log: list[tuple[float, str, str, str]] = []
        """(clock, gpu_id, action, detail) for events."""

    # ------------------------------------------------------------------ queries
    def _slices(self, gpu_id: str) -> list[Slice]:
        return [st.slice for st in self.c.allocator.states() if st.slice.gpu_id == gpu_id]

    def _online_leases(self, gpu_id: str) -> list[str]:
        out = []
        for s in self._slices(gpu_id):
            out += [x.id for x in self.c.allocator.leases.on_slice(s.id) if x.priority >= 0]
        return out

    def view(self) -> dict[str, object]:
        return {
            g.gpu_id: {
                "state": g.state,
                "detail": g.detail,
                "layout": [str(i) for i in (g.plan.target if g.plan and g.state == "merged" else ())],
                "last_s": None if g.last_s is None else round(g.last_s, 3),
            }
            for g in self.gpus.values()
        }

    # ------------------------------------------------------------------ actions
    def merge_all(self) -> list[GpuNight]:
        """NIGHT: merge every named GPU still in its day layout (a refused or failed one waits for
        the next night: no retry loop)."""
        return [self.merge(g) for g, st in self.gpus.items() if st.state == "day"]

    def restore_all(self) -> list[GpuNight]:
        """Before DAY: restore every merged GPU (a failed restore stays ``merged`` and is retried)."""
        out = []
        for g, st in self.gpus.items():
            if st.state == "merged":
                out.append(self.restore(g))
            elif st.state in ("refused", "failed"):
                st.state = "day"
        return out

    def merge(self, gpu_id: str) -> GpuNight:
        st = self.gpus[gpu_id]
        slices = self._slices(gpu_id)
        if not slices or any(s.kind is not SliceKind.MIG for s in slices):
            return self._end(st, "refused", "not a MIG GPU of the pool")
        s0 = slices[0]
        act = self.actuator_of(s0.node)
        source = act.current(s0.gpu_index)
        online = self._online_leases(gpu_id)
        plan = plan_merge(
            gpu_id,
            s0.gpu_model,
            source,
            idle=dict.fromkeys(source, not online),
            target_profiles=self.target_profiles,
        )
        if isinstance(plan, Refusal):
            why = plan.reason + (f" (online leases {', '.join(sorted(online))})" if online else "")
            return self._end(st, "refused", why)
        return self._apply(st, plan, to_state="merged", restart_standby=False)

    def restore(self, gpu_id: str) -> GpuNight:
        st = self.gpus[gpu_id]
        if st.plan is None or st.state != "merged":
            return st
        return self._apply(st, st.plan.reverse(), to_state="day", restart_standby=True, forward=st.plan)

    def _apply(
        self,
        st: GpuNight,
        plan: RepartitionPlan,
        *,
        to_state: str,
        restart_standby: bool,
        forward: RepartitionPlan | None = None,
    ) -> GpuNight:
        gpu_id = plan.gpu_id
        t0 = self.clock.now()
        s0 = self._slices(gpu_id)[0]
        node, index = s0.node, s0.gpu_index
        why = f"tidal: {'NIGHT re-partition' if to_state == 'merged' else 'DAY restore'} of {gpu_id}"
        if not restart_standby and self.standby is not None:
            st.stopped = self.standby.stop(gpu_id)
        self.c.drain_gpu(gpu_id, revoke=True, reason=why)
        self._log(gpu_id, "drained", why)
        out = self.actuator_of(node).apply(node, {index: plan.target})
        if not out.ok:
            self.c.undrain_gpu(gpu_id)
            if not restart_standby and self.standby is not None:
                self.standby.start(gpu_id, st.stopped)
            return self._end(
                st, "merged" if restart_standby else "failed", f"{out.actuator}: {out.detail}", t0
            )
        self._sync(node, gpu_id)
        self.c.undrain_gpu(gpu_id)
        if restart_standby and self.standby is not None:
            self.standby.start(gpu_id, st.stopped)
            st.stopped = None
        st.plan = plan if to_state == "merged" else forward
        layout = ", ".join(map(str, plan.target))
        return self._end(st, to_state, f"applied via {out.actuator}: [{layout}]", t0)

    def _sync(self, node: str, gpu_id: str) -> None:
        led = self.c.allocator.ledger
        keep = [
            replace(led.slice(sid), healthy=led.is_healthy(sid))
            for sid in led.slice_ids()
            if led.slice(sid).node == node and led.slice(sid).gpu_id != gpu_id
        ]
        fresh = [s for s in self.discover(node) if s.gpu_id == gpu_id]
        self.c.sync_node(node, [*keep, *fresh])

    def _end(self, st: GpuNight, state: str, detail: str, t0: float | None = None) -> GpuNight:
        st.state, st.detail = state, detail
        if t0 is not None:
            st.last_s = self.clock.now() - t0
        self._log(st.gpu_id, state, detail)
        return st

    def _log(self, gpu_id: str, action: str, detail: str) -> None:
        self.log.append((self.clock.now(), gpu_id, action, detail))


__all__ = ["GpuNight", "LayoutActuator", "NightRepartitioner", "Standby"]
