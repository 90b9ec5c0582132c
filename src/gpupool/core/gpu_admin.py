"""`GpuAdmin`: the per-GPU half of `LeaseController`: readings into the watermarks, GPU health from
node agents (XIDs), drain / undrain, slice health, watermark thresholds, and a node's slice list as its
agent discovered it (`sync_node`: new slices added, vanished or reshaped ones revoked then removed).
Drain and GPU health apply to the KV budgets of the backends on the GPU too (`_sync_kv`), so the
proxy's request leases never land on a drained or unhealthy GPU.

Role: a mixin of `LeaseController` only (it owns none of the state it touches; the controller's
``__init__`` creates every attribute declared below). Split out to keep the controller's admission,
queue and durability code readable; the invariants are the controller's (see its module docstring):
every change goes through the allocator's health marks, so its events, store writes and queue pumps
follow as for any other lease change, and each public call ends with ``_finish``.
"""

from __future__ import annotations

from gpupool.core.allocator import Allocator
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.model import Lease
from gpupool.core.outcome import Outcome
from gpupool.core.ports import GatewayEvent
from gpupool.core.watermarks import Reading, Signal, WatermarkBank, WatermarkConfig
from gpupool.hardware.slices import Slice


class GpuAdmin:
    allocator: Allocator
    kv: Allocator
    _unroutable: dict[str, set[str]]
    bank: WatermarkBank
    readings: dict[str, Reading]
    gpu_health: dict[str, str]
    drained: set[str]
    closed: set[str]
    """Slices an admin marked unhealthy (`mark_slice`): an undrain, a GPU back to health or an agent's
    healthy slice leaves them closed; only `mark_slice` reopens them."""
    _gpus: set[str]
    _events: list[GatewayEvent]
    _freed: bool

    def _finish(self, out: Outcome | None) -> Outcome:  # the controller's
        raise NotImplementedError

    def feed_reading(
        self, reading: Reading, *, health: str = "ok", xids: tuple[int, ...] = ()
    ) -> GatewayEvent | None:
        """One GPU sample from a node agent or device source. Returns the pause/resume event, if any."""
        gpu = reading.gpu_id
        if gpu not in self._gpus:
            raise InvalidInput("gpu_id", gpu, "no such GPU in the pool")
        if health not in ("ok", "degraded", "failed"):
            raise InvalidInput("health", health, "must be ok, degraded or failed")
        self.readings[gpu] = reading
        self._set_health(gpu, health, xids)
        t = self.bank.feed(reading)
        ev = None
        if t is not None:
            p2 = self._p2_on_gpu(gpu)
            ev = GatewayEvent(
                kind=t.signal.value,
                at=t.at_s,
                gpu_id=gpu,
                reason=t.reason,
                lease_ids=tuple(x.id for x in p2),
                tenants=tuple(sorted({x.request.tenant for x in p2})),
            )
            self._events.append(ev)
            if t.signal is Signal.RESUME:
                self._freed = True
        self._finish(None)
        return ev

    def drain_gpu(self, gpu_id: str, *, revoke: bool = False, reason: str = "") -> tuple[Lease, ...]:
        sids = self._gpu_slices(gpu_id)
        self.drained.add(gpu_id)
        out: list[Lease] = []
        for sid in sids:
            why = reason or f"GPU {gpu_id} drained"
            out.extend(self.allocator.mark_unhealthy(sid, revoke=revoke, reason=why))
        self._sync_kv(gpu_id, revoke=revoke, reason=reason or f"GPU {gpu_id} drained")
        self._finish(None)
        return tuple(out)

    def undrain_gpu(self, gpu_id: str) -> None:
        self._gpu_slices(gpu_id)  # (UnknownId)
        self.drained.discard(gpu_id)
        self._reopen(gpu_id)
        self._freed = True
        self._finish(None)

    def mark_slice(
        self, slice_id: str, *, healthy: bool, revoke: bool = False, reason: str = ""
    ) -> tuple[Lease, ...]:
        """Open or close one slice (an admin's mark: it stays until the next mark, see ``closed``).
        A slice of a drained GPU stays closed (opening it would grant on the drained GPU, and a
        restart would close it again): `undrain_gpu` opens it with its GPU."""
        st = self.allocator.slice_state(slice_id)  # raises UnknownId
        out: tuple[Lease, ...] = ()
        if healthy:
            self.closed.discard(slice_id)
        else:
            self.closed.add(slice_id)
        if healthy and st.slice.gpu_id in self.drained:
            return out
        if healthy:
            self.allocator.mark_healthy(slice_id)
            self._freed = True
        else:
            out = self.allocator.mark_unhealthy(slice_id, revoke=revoke, reason=reason or "marked unhealthy")
        self._finish(None)
        return out

    def sync_node(self, node: str, slices: list[Slice]) -> dict[str, list[str]]:
        """Make ``node``'s slices equal ``slices`` (what its agent discovered).

        New slices are added; a slice that vanished or changed shape has its leases revoked (their
        holders get ``revoked`` events) and is removed, then re-added in its new shape; health follows
        the new value (unhealthy revokes). Bad input (a slice of another node, a duplicate id, a GPU
        that belongs to another node) raises `InvalidInput` before anything changes.
        """
        led = self.allocator.ledger
        seen: dict[str, str] = {}
        for i, s in enumerate(slices):
            if s.node != node:
                raise InvalidInput(f"slices[{i}].node", s.node, f"must be {node!r}")
            if s.id in seen:
                raise InvalidInput(f"slices[{i}].id", s.id, "appears twice")
            seen[s.id] = s.gpu_id
            owner = next((led.slice(x).node for x in led.on_gpu(s.gpu_id)), node)
            if owner != node:
                raise InvalidInput(f"slices[{i}].gpu_id", s.gpu_id, f"is a GPU of node {owner!r}")
            if s.id in led and led.slice(s.id).node != node:
                raise InvalidInput(f"slices[{i}].id", s.id, f"is a slice of node {led.slice(s.id).node!r}")
        want = {s.id: s for s in slices}
        report: dict[str, list[str]] = {"added": [], "removed": [], "health": [], "revoked": []}
        mine = sorted(sid for sid in led.slice_ids() if led.slice(sid).node == node)
        for sid in mine:
            old, new = led.slice(sid), want.get(sid)
            if new is not None and _same_shape(old, new):
                if led.is_healthy(sid) != new.healthy:
                    report["health"].append(sid)
                    if not new.healthy:
                        why = f"node agent on {node}: slice {sid} unhealthy"
                        ended = self.allocator.mark_unhealthy(sid, revoke=True, reason=why)
                        report["revoked"] += [x.id for x in ended]
                    elif self._gpu_open(old.gpu_id) and sid not in self.closed:
                        self.allocator.mark_healthy(sid)
                        self._freed = True
                continue
            why = f"node agent on {node}: slice {sid} " + ("changed" if new is not None else "vanished")
            report["revoked"] += [x.id for x in self.allocator.mark_unhealthy(sid, revoke=True, reason=why)]
            self.allocator.remove_slice(sid)
            report["removed"].append(sid)
        for sid, s in want.items():
            if sid not in led:
                self.allocator.add_slice(s)
                report["added"].append(sid)
        self._gpus = set(led.gpu_ids())
        self._freed = True
        self._finish(None)
        return report

    def set_watermarks(self, config: WatermarkConfig) -> None:
        self.bank.reconfigure(config)

    def paused_gpus(self) -> set[str]:
        return {g for g, m in self.bank.machines().items() if m.paused}

    def _gpu_slices(self, gpu_id: str) -> list[str]:
        sids = self.allocator.ledger.on_gpu(gpu_id)
        if not sids:
            raise UnknownId("gpu", gpu_id)
        return list(sids)

    def _p2_on_gpu(self, gpu_id: str) -> list[Lease]:
        out: dict[str, Lease] = {}
        for sid in self.allocator.ledger.on_gpu(gpu_id):
            for x in self.allocator.leases.on_slice(sid):
                if x.request.is_preemptible:
                    out[x.id] = x
        for st in self.kv.states():
            if st.slice.gpu_id == gpu_id:
                for x in self.kv.leases.on_slice(st.slice.id):
                    if x.request.is_preemptible:
                        out[x.id] = x
        return [out[k] for k in sorted(out)]

    def _set_health(self, gpu: str, health: str, xids: tuple[int, ...]) -> None:
        before = self.gpu_health.get(gpu, "ok")
        if health == before:
            return
        self.gpu_health[gpu] = health
        if health == "ok":
            self._reopen(gpu)
            return
        why = f"GPU {gpu} {health}" + (f" (XID {', '.join(map(str, xids))})" if xids else "")
        for sid in self.allocator.ledger.on_gpu(gpu):
            self.allocator.mark_unhealthy(sid, revoke=health == "failed", reason=why)
        self._sync_kv(gpu, revoke=health == "failed", reason=why)

    def _gpu_open(self, gpu_id: str) -> bool:
        """Neither drained nor unhealthy: its slices (but those an admin closed) and its backends' KV
        budgets may take leases."""
        return gpu_id not in self.drained and self.gpu_health.get(gpu_id, "ok") == "ok"

    def _reopen(self, gpu_id: str) -> None:
        """After an undrain or a return to health: open the GPU's slices, but those an admin closed
        (``closed``), if nothing else keeps the GPU closed; its KV budgets follow (`_sync_kv`)."""
        if self._gpu_open(gpu_id):
            for sid in self.allocator.ledger.on_gpu(gpu_id):
                if sid not in self.closed:
                    self.allocator.mark_healthy(sid)
            self._freed = True
        self._sync_kv(gpu_id)

    def _sync_kv(self, gpu_id: str, *, revoke: bool = False, reason: str = "") -> None:
        """The KV budgets of the backends on ``gpu_id`` follow their GPU: open while it is neither
        drained nor unhealthy (and the backend is routable), closed otherwise; ``revoke`` also ends
        the leases on them (request leases, and the lane's shares, whose requests end with them)."""
        usable = self._gpu_open(gpu_id)
        for sid in self.kv.ledger.on_gpu(gpu_id):
            if usable and sid not in self._unroutable:
                self.kv.mark_healthy(sid)
                self._freed = True
            else:
                self.kv.mark_unhealthy(sid, revoke=revoke, reason=reason)


def _same_shape(a: Slice, b: Slice) -> bool:
    """Same slice apart from health (a change of anything else re-creates it)."""
    return (a.gpu_id, a.kind, a.capacity, a.gpu_index, a.profile, a.uuid, a.gpu_model) == (
        b.gpu_id,
        b.kind,
        b.capacity,
        b.gpu_index,
        b.profile,
        b.uuid,
        b.gpu_model,
    )
