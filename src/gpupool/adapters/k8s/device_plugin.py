"""Kubelet device plugin (API v1beta1) for ``<domain>/gpu`` over gRPC on a unix socket (grpcio).

Role: advertise this node's cards to kubelet and, at container creation, hand the container the
environment of the lease the extender bound for its pod.

- Devices: ``replicas`` device IDs per physical card (``<gpu id, sanitised>-<k>``), so several pods
  can share a card; a pod asking ``<domain>/gpu: N`` gets N IDs. Health per card; any change resends
  the full list on every open ListAndWatch stream. In Kubernetes, `follow` takes health (and new
  cards) from the node agent's ``<domain>/slices`` annotation, so ListAndWatch follows the agent's
  health view; a card the agent no longer lists is reported unhealthy.
- GetPreferredAllocation / Allocate match the container to a bound lease through the node-local
  `PendingQueue` (no node lock); Allocate returns ``NVIDIA_VISIBLE_DEVICES`` (GPU or MIG UUIDs, card
  indices for whole cards without a UUID), and for MPS or shared-card grants
  ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``<ordinal>=<MiB>M`` per card),
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (when compute was reserved) and the pipe directory mount (the
  one the node agent published for that MPS slice, else ``--mps-pipe-dir``), and the MPS daemon's shm
  directory mounted as ``/dev/shm`` (``--mps-shm-dir``; without one the daemon uses the host's IPC
  namespace, which Allocate cannot grant: the response then carries ``<domain>/mps-host-ipc: required``
  and the pod must set ``hostIPC: true``), plus ``GPUPOOL_LEASE_ID`` / ``GPUPOOL_POD``. The MPS part is
  built per MPS grant by an injected `MpsSide` (the CLI passes ``gpupool.adapters.mps.container_mps``,
  NVIDIA k8s-device-plugin's MPS container side; the built-in `plain_mps_side` gives the same shape;
  `gpupool.adapters.k8s.containerenv`). When no placement waits, Allocate first lists the node's pods
  once (`catch_up`: kubelet may see the Binding before the pod feed's watch does). A MIG grant without
  a device UUID, MPS grants of one container on daemons with different pipe directories (a client
  talks to one daemon), or still no waiting lease, fail the whole Allocate with
  ``FAILED_PRECONDITION`` (kubelet does not retry it: the pod fails to start). Device IDs this
  plugin never advertised, repeated IDs, an empty ID list, a negative ``allocation_size`` or
  ``must_include_deviceIDs`` outside ``available_deviceIDs`` are ``INVALID_ARGUMENT``, checked
  before any lease is taken. Error details are cut to `MAX_DETAIL_CHARS` (gRPC refuses status
  messages over its metadata limit).
- Registration: serve ``<plugin_dir>/<endpoint>``, then ``Register`` on ``<plugin_dir>/kubelet.sock``.
  A watcher re-creates the socket and registers again whenever kubelet.sock is re-created (kubelet
  restart) or our socket disappears.
- Verification: when the PodResources socket exists, `verify` lists pod devices and reports pods
  whose cards differ from their lease (drift; the container already runs, so it is not undone).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.adapters.k8s.annotations import Placement, decode_pipe_dirs, decode_slices
from gpupool.adapters.k8s.containerenv import MpsSide, container_env, plain_mps_side
from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError, WatchExpiredError
from gpupool.adapters.k8s.pending import PendingQueue, feed
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, ResourceNames
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import Slice, SliceKind

log = logging.getLogger("gpupool.device_plugin")

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
MAX_DEVICE_ID_CHARS = 63
MAX_DETAIL_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Card:
    gpu_id: str
    index: int
    uuid: str = ""
    healthy: bool = True


def cards_of(slices: Iterable[Slice], node: str) -> list[Card]:
    """This node's physical cards from its slices (a card is unhealthy when all its slices are)."""
    by_gpu: dict[str, list[Slice]] = {}
    for s in slices:
        if s.node == node:
            by_gpu.setdefault(s.gpu_id, []).append(s)
    out = []
    for gpu, ss in by_gpu.items():
        uuid = next((s.uuid for s in ss if s.uuid and s.kind is not SliceKind.MIG), "")
        out.append(Card(gpu, ss[0].gpu_index, uuid, any(s.healthy for s in ss)))
    return sorted(out, key=lambda c: (c.index, c.gpu_id))


def device_id(gpu_id: str, k: int) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "_", gpu_id)
    did = f"{base}-{k}"
    if len(did) > MAX_DEVICE_ID_CHARS:
        raise InvalidInput("device id", did, f"longer than {MAX_DEVICE_ID_CHARS} characters")
    return did


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node: str
    names: ResourceNames = DEFAULT_NAMES
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    endpoint: str = "gpupool.sock"
    replicas: int = 16
    mps_pipe_dir: str = "/tmp/nvidia-mps"  # noqa: S108 - the MPS default pipe directory, shared on purpose
    mps_shm_dir: str = ""
    """Host directory the MPS daemons use as ``/dev/shm``; empty: they share the host's IPC namespace."""
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    poll_s: float = 1.0

    @property
    def kubelet_socket(self) -> str:
        return str(Path(self.plugin_dir) / "kubelet.sock")

    @property
    def socket(self) -> str:
        return str(Path(self.plugin_dir) / self.endpoint)


def _detail(exc: Exception) -> str:
    """A gRPC status message: ``exc`` cut in the middle (the field first, the reason last) to
    `MAX_DETAIL_CHARS`: a longer one never reaches the caller."""
    text, half = str(exc), (MAX_DETAIL_CHARS - 3) // 2
    return text if len(text) <= MAX_DETAIL_CHARS else f"{text[:half]}...{text[-half:]}"


def _pb() -> tuple[Any, Any]:
    from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
    from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2_grpc as pbg

    return pb, pbg


def _pr() -> tuple[Any, Any]:
    from gpupool.adapters.k8s.proto import podresources_v1_pb2 as pr
    from gpupool.adapters.k8s.proto import podresources_v1_pb2_grpc as prg

    return pr, prg


class DevicePlugin:
    """The gRPC servicer plus its lifecycle (serve, register, re-register, health, verify)."""

    def __init__(
        self,
        config: PluginConfig,
        cards: Iterable[Card],
        *,
        queue: PendingQueue | None = None,
        mps: MpsSide = plain_mps_side,
        api: KubeApi | None = None,
    ) -> None:
        self.config = config
        self.mps = mps
        self.api = api
        """Where Allocate lists this node's pods when no placement waits (`catch_up`)."""
        self.queue = queue or PendingQueue()
        self._cond = threading.Condition()
        self._version = 0
        self._cards = {c.gpu_id: c for c in cards}
        self._ids: dict[str, str] = {}
        for c in self._cards.values():
            for k in range(config.replicas):
                did = device_id(c.gpu_id, k)
                if did in self._ids:
                    raise InvalidInput(
                        "gpu_id", c.gpu_id, f"device id {did} collides with GPU {self._ids[did]}"
                    )
                self._ids[did] = c.gpu_id
        self._server: Any = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.registrations = 0
        self.drifts: list[str] = []
        self.pipe_dirs: dict[str, str] = {}
        """Slice id -> MPS pipe directory, as the node agent published it (else ``config.mps_pipe_dir``)."""

    # ------------------------------------------------------------------ state
    def set_health(self, gpu_id: str, healthy: bool) -> None:
        with self._cond:
            c = self._cards[gpu_id]
            self._cards[gpu_id] = Card(c.gpu_id, c.index, c.uuid, healthy)
            self._version += 1
            self._cond.notify_all()

    def follow(self, slices: Iterable[Slice]) -> list[str]:
        """Take card health from the node's slices as its agent published them (a card is healthy
        while any of its slices is; a card no longer listed is unhealthy; a new card is added).
        Returns the GPU ids whose state changed; open ListAndWatch streams get the new list."""
        want = {c.gpu_id: c for c in cards_of(slices, self.config.node)}
        changed: list[str] = []
        with self._cond:
            for gpu, c in list(self._cards.items()):
                w = want.get(gpu)
                healthy = w.healthy if w is not None else False
                if c.healthy != healthy:
                    self._cards[gpu] = Card(c.gpu_id, c.index, c.uuid, healthy)
                    changed.append(gpu)
            for gpu, w in want.items():
                if gpu in self._cards:
                    continue
                ids = [device_id(gpu, k) for k in range(self.config.replicas)]
                if any(did in self._ids for did in ids):
                    log.warning("card %s skipped: its device ids collide with another card", gpu)
                    continue
                self._cards[gpu] = w
                for did in ids:
                    self._ids[did] = gpu
                changed.append(gpu)
            if changed:
                self._version += 1
                self._cond.notify_all()
        return sorted(changed)

    def pipe_dir_of(self, p: Placement) -> str:
        """The MPS pipe directory for a placement: its first MPS grant's, as the agent published it."""
        for g in p.grants:
            if g.kind is SliceKind.MPS and g.slice_id in self.pipe_dirs:
                return self.pipe_dirs[g.slice_id]
        return self.config.mps_pipe_dir

    def run_node_feed(
        self, api: KubeApi, stop: threading.Event, *, every_s: float = 2.0, names: ResourceNames | None = None
    ) -> None:
        """Read this node's slice annotation and `follow` it now and every ``every_s``, until ``stop``."""
        key = (names or self.config.names).slices
        while not stop.is_set():
            self.read_node_once(api, key)
            stop.wait(every_s)

    def read_node_once(self, api: KubeApi, key: str) -> None:
        """One step of `run_node_feed` (errors are logged: the old view stays until the next read)."""
        try:
            node = api.read_node(self.config.node)
        except KubeApiError as exc:
            log.warning("node feed: %s", exc)
            return
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
        if text is None:
            return
        try:
            slices = decode_slices(text, node=self.config.node, field=f"node annotation {key}")
            pipes = decode_pipe_dirs(text)
        except InvalidInput as exc:
            log.warning("node feed: %s", exc)
            return
        self.pipe_dirs = pipes
        for gpu in self.follow(slices):
            log.info("card %s: %s", gpu, HEALTHY if self._cards[gpu].healthy else UNHEALTHY)

    def device_list(self) -> list[tuple[str, str]]:
        with self._cond:
            return [(did, HEALTHY if self._cards[g].healthy else UNHEALTHY) for did, g in self._ids.items()]

    # ------------------------------------------------------------------ RPCs
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        pb, _ = _pb()
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        pb, _ = _pb()
        seen = -1
        while not self._stop.is_set() and context.is_active():
            with self._cond:
                if seen == self._version:
                    self._cond.wait(timeout=0.5)
                    continue
                seen = self._version
            devices = [pb.Device(ID=did, health=h) for did, h in self.device_list()]
            yield pb.ListAndWatchResponse(devices=devices)

    def _check_ids(self, ids: list[str], field: str) -> None:
        """`InvalidInput` unless ``ids`` are distinct device IDs this plugin advertises."""
        unknown = [d for d in ids if d not in self._ids]
        if unknown:
            raise InvalidInput(field, unknown, f"not devices of {self.config.node}")
        repeated = sorted(d for d, n in Counter(ids).items() if n > 1)
        if repeated:
            raise InvalidInput(field, repeated, "device IDs repeat")

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        import grpc

        pb, _ = _pb()
        out = []
        try:
            for creq in request.container_requests:
                size, must = int(creq.allocation_size), list(creq.must_include_deviceIDs)
                if size < 0:
                    raise InvalidInput("allocation_size", size, "must be >= 0")
                offered = set(creq.available_deviceIDs)
                missing = [d for d in must if d not in offered]
                if missing:
                    raise InvalidInput("must_include_deviceIDs", missing, "not in available_deviceIDs")
                self._check_ids(must, "must_include_deviceIDs")
                available: dict[str, list[str]] = {}
                for did in sorted(offered):
                    if did in self._ids:
                        available.setdefault(self._ids[did], []).append(did)
                ids = self.queue.prefer(size, available, must)
                out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        except InvalidInput as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _detail(exc))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        import grpc

        pb, _ = _pb()
        try:
            for creq in request.container_requests:
                ids = list(creq.devices_ids)
                if not ids:
                    raise InvalidInput("devices_ids", ids, "no device IDs to allocate")
                self._check_ids(ids, "devices_ids")
        except InvalidInput as exc:  # before anything is taken: the queue is unchanged
            log.warning("Allocate refused: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _detail(exc))
        taken: list[Placement] = []
        responses = []
        try:
            for creq in request.container_requests:
                ids = list(creq.devices_ids)
                gpus = frozenset(self._ids[d] for d in ids)
                p = self.queue.take(gpus, len(ids))
                if p is None and self.catch_up():
                    p = self.queue.take(gpus, len(ids))
                if p is None:
                    raise InvalidInput(
                        "devices_ids",
                        ids,
                        f"no bound gpupool lease waits on {self.config.node} for {len(ids)} card(s)",
                    )
                taken.append(p)
                env = container_env(
                    p,
                    mps_pipe_dir=self.config.mps_pipe_dir,
                    domain=self.config.names.domain,
                    pipe_dirs=self.pipe_dirs,
                    shm_dir=self.config.mps_shm_dir,
                    mps=self.mps,
                )
                if env.host_ipc:
                    log.info(
                        "pod %s/%s: its MPS daemon uses the host IPC namespace (hostIPC: true)",
                        p.namespace,
                        p.name,
                    )
                responses.append(
                    pb.ContainerAllocateResponse(
                        envs=env.envs,
                        mounts=[
                            pb.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in env.mounts
                        ],
                        annotations=env.annotations,
                    )
                )
        except InvalidInput as exc:
            for p in taken:
                self.queue.untake(p)
            log.warning("Allocate failed: %s", exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, _detail(exc))
        for p in taken:
            log.info("allocated lease %s to pod %s/%s", p.lease_id, p.namespace, p.name)
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        pb, _ = _pb()
        return pb.PreStartContainerResponse()

    # ------------------------------------------------------------------ lifecycle
    def serve(self) -> None:
        """(Re)create our socket and start the gRPC server on it."""
        import grpc

        _, pbg = _pb()
        if self._server is not None:
            self._server.stop(grace=None)
        path = Path(self.config.socket)
        path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pbg.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._server = server

    def register(self, timeout_s: float = 5.0) -> None:
        import grpc

        pb, pbg = _pb()
        with grpc.insecure_channel(f"unix://{self.config.kubelet_socket}") as channel:
            stub = pbg.RegistrationStub(channel)
            stub.Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.config.endpoint,
                    resource_name=self.config.names.gpu,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=timeout_s,
            )
        self.registrations += 1
        log.info("registered %s with kubelet (%d)", self.config.names.gpu, self.registrations)

    def start(self) -> DevicePlugin:
        self.serve()
        self._watcher = threading.Thread(target=self._watch_kubelet, name="gpupool-dp-kubelet", daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        if self._server is not None:
            self._server.stop(grace=None)
        Path(self.config.socket).unlink(missing_ok=True)

    def _kubelet_stamp(self) -> tuple[int, int] | None:
        try:
            st = Path(self.config.kubelet_socket).stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def _watch_kubelet(self) -> None:
        registered_with: tuple[int, int] | None = None
        while not self._stop.is_set():
            stamp = self._kubelet_stamp()
            ours = Path(self.config.socket).exists()
            if stamp is not None and (stamp != registered_with or not ours):
                try:
                    if not ours or registered_with is not None:
                        self.serve()
                    self.register()
                    registered_with = stamp
                except Exception as exc:  # NOTE: kubelet may be mid-restart; try again next poll
                    log.warning("registration with kubelet failed: %s", exc)
            self._stop.wait(self.config.poll_s)

    # ------------------------------------------------------------------ pods and verification
    def feed(self, kind: str, pod: dict[str, Any]) -> None:
        feed(
            self.queue, kind, pod, node=self.config.node, names=self.config.names, on_error=self.drifts.append
        )

    def catch_up(self) -> bool:
        """List this node's pods once into the queue (Allocate found no waiting placement: kubelet
        may have seen the Binding before the pod feed's watch did, and a refused Allocate fails the
        pod for good). False without an API or when the list fails."""
        if self.api is None:
            return False
        try:
            pods, _ = self.api.list_pods(field_selector=f"spec.nodeName={self.config.node}")
        except KubeApiError as exc:
            log.warning("Allocate: listing the pods of %s failed: %s", self.config.node, exc)
            return False
        for pod in pods:
            self.feed("ADDED", pod)
        return True

    def run_pod_feed(self, api: KubeApi, stop: threading.Event, *, watch_timeout_s: int = 300) -> None:
        """List + watch this node's pods into the queue until ``stop``; relist on expiry or errors."""
        selector = f"spec.nodeName={self.config.node}"
        while not stop.is_set():
            try:
                pods, rv = api.list_pods(field_selector=selector)
                for pod in pods:
                    self.feed("ADDED", pod)
                while not stop.is_set():
                    for kind, obj in api.watch_pods(rv, field_selector=selector, timeout_s=watch_timeout_s):
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if kind != "BOOKMARK":
                            self.feed(kind, obj)
                        if stop.is_set():
                            return
            except KubeApiError as exc:
                if not isinstance(exc, WatchExpiredError):
                    log.warning("pod feed: %s", exc)
                    stop.wait(self.config.poll_s)
            except Exception:  # one bad event or a bug must not end the feed: logged, then a relist
                log.exception("pod feed failed; listing again")
                stop.wait(self.config.poll_s)

    def verify(self, timeout_s: float = 5.0) -> list[str]:
        """Check taken leases against kubelet's PodResources; returns (and records) new drift lines."""
        import grpc

        pr, prg = _pr()
        if not Path(self.config.pod_resources_socket).exists():
            return []
        with grpc.insecure_channel(f"unix://{self.config.pod_resources_socket}") as channel:
            resp = prg.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=timeout_s)
        seen: dict[tuple[str, str], frozenset[str]] = {}
        for pod in resp.pod_resources:
            gpus = {
                self._ids.get(d, d)
                for c in pod.containers
                for dev in c.devices
                if dev.resource_name == self.config.names.gpu
                for d in dev.device_ids
            }
            if gpus:
                seen[(pod.namespace, pod.name)] = frozenset(gpus)
        drift = self.queue.verify(seen)
        self.drifts.extend(drift)
        for line in drift:
            log.warning("drift: %s", line)
        return drift
