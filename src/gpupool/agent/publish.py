"""`SlicePublisher`: the agent's observer that publishes the node's slices to the control plane and as
the ``<domain>/slices`` node annotation (the extender and the device plugin read it).

Role: after every tick, discover the node (`gpupool.agent.inventory.discover`) from the newest device
snapshot and the agent's health view; when the slice list differs from the last one published (GPU
added, removed, failed, MIG layout changed), or ``resync_s`` passed, hand it to a worker thread that
sends it:

- ``PUT {gateway}/v1/nodes/{node}/slices`` (the gateway adds new slices, revokes the leases of
  vanished ones -- their holders get ``revoked`` events -- and follows health);
- a JSON merge patch of the node's ``<domain>/slices`` annotation through the Kubernetes API.

Invariants:
- The tick never waits on the network: the observer only computes and stores the newest list
  (latest wins); the worker sends it. A failed send is retried at the next tick's chance (the
  list counts as published only once every configured target accepted it).
- One PUT holds the worker at most ``timeout_s`` plus one read (`bounded_request`): a gateway that
  never finishes its answer is a failed send, retried like any other.
- Each target is sent the whole list (state, not deltas), so a restarted gateway or a lost patch is
  repaired by the next send; an unchanged list is re-sent every ``resync_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpupool.adapters.k8s.annotations import encode_slices
from gpupool.agent.gateway_client import bounded_request, json_body
from gpupool.agent.inventory import DEFAULT_MPS_PIPE_DIR, NodeInventory, discover, slice_json
from gpupool.agent.values import AgentEvent, NodeSnapshot
from gpupool.hardware.devices import DeviceSnapshot, GpuReading, MigDeviceReading
from gpupool.hardware.slices import Slice

log = logging.getLogger("gpupool.agent.publish")

DEFAULT_ANNOTATION = "gpupool.io/slices"


def device_snapshot_of(snap: NodeSnapshot) -> DeviceSnapshot:
    """A hardware-shaped snapshot from the agent's samples (for sources without one, e.g. scripted)."""
    gpus = []
    for st in snap.gpus:
        s = st.sample
        migs = tuple(
            MigDeviceReading(
                uuid=i.uuid,
                index=n,
                gpu_instance_id=i.gi_id if i.gi_id is not None else n,
                compute_instance_id=0,
                profile=i.mig_profile,
                memory_total_mib=i.vram_total_mib,
                memory_used_mib=i.vram_used_mib,
                start=_start_of(i.gpu_id),
            )
            for n, i in enumerate(s.instances)
        )
        gpus.append(
            GpuReading(
                index=s.index,
                uuid=s.uuid,
                name=s.model,
                model=s.model,
                memory_total_mib=s.vram_total_mib,
                memory_used_mib=s.vram_used_mib,
                mig_enabled=bool(migs),
                mig_devices=migs,
                healthy=not s.error,
                error=s.error,
            )
        )
    return DeviceSnapshot(snap.node, snap.at_s, tuple(gpus), source="scripted")


def _signature(dev: DeviceSnapshot) -> tuple[object, ...]:
    """What discovery reads from a snapshot (not the moving numbers: used memory, temperature)."""
    return tuple(
        (
            g.index, g.uuid, g.name, g.model, g.pci_bus_id, g.memory_total_mib, g.memory_reserved_mib,
            g.mig_enabled, g.mig_pending, g.healthy, g.error,
            tuple((d.uuid, d.profile, d.start, d.gpu_instance_id, d.memory_total_mib) for d in g.mig_devices),
        )
        for g in dev.gpus
    )  # fmt: skip


def _start_of(slice_id: str) -> int:
    tail = slice_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


class SlicePublisher:
    def __init__(
        self,
        node: str,
        *,
        device_snapshot: Callable[[], DeviceSnapshot | None] | None = None,
        gateway: str | None = None,
        token: str = "",
        kube: Any = None,
        annotation: str = DEFAULT_ANNOTATION,
        planned: Sequence[Slice] = (),
        mps_pipe_dir: str = DEFAULT_MPS_PIPE_DIR,
        mps_pipe_dirs: Mapping[str, str] | None = None,
        resync_s: float = 30.0,
        retry_s: float = 1.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.device_snapshot = device_snapshot
        self.gateway = gateway.rstrip("/") if gateway else None
        self.token = token
        self.kube = kube
        self.annotation = annotation
        self.planned = tuple(planned)
        self.mps_pipe_dir = mps_pipe_dir
        self.mps_pipe_dirs = dict(mps_pipe_dirs or {})
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.last: NodeInventory | None = None
        """The newest inventory (tick thread writes; readers get a whole value)."""
        self.published = 0
        self.errors: list[str] = []
        self.last_report: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._pending: NodeInventory | None = None
        self._sent_key: str | None = None
        self._sent_at = -float("inf")
        self._retry_at = -float("inf")
        self._inflight_key: str | None = None
        self._stop = False
        self._sig: object = None
        self._last_key = ""
        self._thread: threading.Thread | None = None
        self._client: Any = None

    # ------------------------------------------------------------------ tick thread
    def inventory(self, snap: NodeSnapshot) -> NodeInventory:
        dev, unhealthy = self._inputs(snap)
        return self._discover(dev, unhealthy)

    def _inputs(self, snap: NodeSnapshot) -> tuple[DeviceSnapshot, dict[str, str]]:
        dev = self.device_snapshot() if self.device_snapshot is not None else None
        if dev is None or dev.node != snap.node:
            dev = device_snapshot_of(snap)
        unhealthy = {g.sample.gpu_id: g.problem or "unhealthy" for g in snap.gpus if not g.healthy}
        return dev, unhealthy

    def _discover(self, dev: DeviceSnapshot, unhealthy: dict[str, str]) -> NodeInventory:
        return discover(
            dev,
            planned=self.planned,
            unhealthy=unhealthy,
            mps_pipe_dir=self.mps_pipe_dir,
            mps_pipe_dirs=self.mps_pipe_dirs,
            previous=self.last.slices if self.last is not None else (),
        )

    def __call__(self, snap: NodeSnapshot, events: Sequence[AgentEvent]) -> None:
        dev, unhealthy = self._inputs(snap)
        sig = (_signature(dev), tuple(sorted(unhealthy.items())))
        if sig != self._sig or self.last is None:  # discovery only when what it reads changed
            self._sig = sig
            self.last = self._discover(dev, unhealthy)
            self._last_key = self._key(self.last)
        inv, key = self.last, self._last_key
        with self._cond:
            now = self.clock()
            due = now - self._sent_at >= self.resync_s
            if key == self._inflight_key or (key == self._sent_key and not due) or now < self._retry_at:
                return
            self._pending = inv
            self._inflight_key = key
            self._cond.notify_all()

    def _key(self, inv: NodeInventory) -> str:
        return encode_slices(list(inv.slices), pipe_dirs=dict(inv.mps_pipe_dirs))

    # ------------------------------------------------------------------ sending
    def publish(self, inv: NodeInventory) -> list[str]:
        """Send ``inv`` to every target now (the worker's step; tests call it directly). Returns the
        errors (empty when every target accepted)."""
        errors: list[str] = []
        if self.gateway:
            errors += self._to_gateway(inv)
        if self.kube is not None:
            try:
                self.kube.annotate_node(self.node, {self.annotation: self._key(inv)})
            except Exception as exc:  # NOTE: KubeApiError or transport: retried at the next chance
                errors.append(f"annotate node {self.node}: {exc}")
        return errors

    def _to_gateway(self, inv: NodeInventory) -> list[str]:
        import httpx

        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.Client(timeout=self.timeout_s, headers=headers)
        body = {"slices": [slice_json(s, inv.pipe_dir(s.id)) for s in inv.slices]}
        url = f"{self.gateway}/v1/nodes/{self.node}/slices"
        resp = bounded_request(
            self._client, "PUT", url, deadline_s=self.timeout_s, max_body_bytes=1 << 20, json=body
        )
        if isinstance(resp, str):
            return [resp]
        if resp.status_code >= 300:
            return [f"PUT {url}: HTTP {resp.status_code} {resp.text[:300]}"]
        report = json_body(resp)
        self.last_report = dict(report) if isinstance(report, dict) else {}
        return []

    def flush(self) -> list[str]:
        """Send the pending inventory on the calling thread (tests, shutdown); returns its errors."""
        with self._cond:
            inv = self._pending
            self._pending = None
        return self._send(inv) if inv is not None else []

    def _send(self, inv: NodeInventory) -> list[str]:
        errors = self.publish(inv)
        key = self._key(inv)
        with self._cond:
            if not errors:
                self._sent_key, self._sent_at = key, self.clock()
                self.published += 1
            else:
                self._retry_at = self.clock() + self.retry_s
                self.errors = (self.errors + errors)[-20:]
                for e in errors:
                    log.warning("publishing slices: %s", e)
            if self._inflight_key == key and self._pending is None:
                self._inflight_key = None
        return errors

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                inv, self._pending = self._pending, None
            if inv is not None:
                self._send(inv)

    def start(self) -> SlicePublisher:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"gpupool-publish-{self.node}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * 2 + 1)
            self._thread = None
        if self._client is not None:
            self._client.close()
            self._client = None
