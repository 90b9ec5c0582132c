"""Composition root of the node agent: builds the device source, pausers, engine scraper, gateway
reporter and ``/metrics`` page around a `NodeAgent`, and runs its loop on a thread on the real clock.

Role: the only place that wires several adapters together for the agent (`gpupool agent` and the
``make run`` demo call `build_runtime` / `AgentRuntime.start`).

Invariants:
- The loop thread owns all agent state; the reporter and scraper threads only exchange values with
  it through their own locks (see `gpupool.agent.loop`).
- Failure events (`LOGGED_KINDS`) are logged as they are published, each distinct one at most once
  per `LOG_REPEAT_S`: the log names the workload and the reason without flooding at the tick rate.
- `AgentRuntime.stop` is idempotent: stops the loop, the scraper, the reporter (one last flush) and
  the metrics server, and closes the device source.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.adapters.metrics.dcgm import AgentGauges, AgentMetrics, GpuGauges
from gpupool.adapters.pause import availability, default_pausers
from gpupool.agent.devices import open_source
from gpupool.agent.engines import Engine, EngineScraper
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.gateway_client import GatewayReporter
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent, NodeSnapshot
from gpupool.agent.mps import MpsGpu, MpsLimitTable, MpsSupervisor
from gpupool.agent.source import DeviceSource, GpuSample, ScriptedSource
from gpupool.core.clock import FunctionClock
from gpupool.core.pausers import Workload
from gpupool.hardware.slices import Slice, SliceKind

log = logging.getLogger("gpupool.agent")

LOGGED_KINDS = frozenset(
    {
        "pauser_failure",
        "evict_failed",
        "grant_free_failed",
        "source_error",
        "config_error",
        "unhealthy",
        "engine_sleep_failed",
        "engine_wake_failed",
        "mps_failure",
        "failure_cleared",
    }
)
"""Event kinds the agent also logs (warnings of ``gpupool.agent``): the failures an operator acts on,
and the end of one that persisted."""
LOG_REPEAT_S = 60.0
"""The same failure (kind, GPU, lease, reason) is logged again only after this long."""


def _gauge(s: GpuSample, *, parent: GpuSample | None = None, **own: Any) -> GpuGauges:
    """dcgm-exporter's view: a MIG instance carries its parent GPU's UUID and PCI bus id (it is told
    apart by ``GPU_I_ID``); ``modelName`` is NVML's device name when the source knows it."""
    card = parent if parent is not None else s
    return GpuGauges(
        s.index,
        card.uuid,
        s.vram_used_mib,
        s.vram_total_mib,
        model=card.name or s.name or s.model,
        pci_bus_id=card.pci_bus_id,
        util_pct=s.util_pct,
        engine_active_ratio=s.engine_active_ratio,
        temperature_c=s.temperature_c,
        power_mw=s.power_mw,
        mig_profile=s.mig_profile,
        gi_id=s.gi_id,
        gpu_id=s.gpu_id,
        **own,
    )


def gauges_of(
    snap: NodeSnapshot, *, last_xid: dict[str, int], reporter: GatewayReporter | None
) -> AgentGauges:
    gpus: list[GpuGauges] = []
    for g in snap.gpus:
        s = g.sample
        gpus.append(
            _gauge(
                s,
                last_xid=last_xid.get(s.gpu_id, 0),  # the agent watches XIDs from its start: none = 0
                effective_used_mib=g.reading.vram_used_mib if g.reading is not None else None,
                paused=g.paused,
                healthy=g.healthy,
            )
        )
        for inst in s.instances:
            gpus.append(_gauge(inst, parent=s, paused=g.paused, healthy=g.healthy))
    states = Counter(st for _lid, _gpu, st in snap.workloads)
    return AgentGauges(
        tuple(gpus),
        workloads_by_state=tuple(sorted(states.items())),
        gateway_connected=None if reporter is None else reporter.connected,
        outbox_events=0 if reporter is None else reporter.pending(),
    )


@dataclass
class AgentRuntime:
    agent: NodeAgent
    source: DeviceSource
    reporter: GatewayReporter | None = None
    scraper: EngineScraper | None = None
    metrics: AgentMetrics | None = None
    metrics_port: int | None = None
    _server: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last_xid: dict[str, int] = field(default_factory=dict)
    _logged: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    _stopped: bool = False
    pauser_status: dict[str, str] = field(default_factory=dict)
    """Pauser name -> '' when usable here, else the detected reason (cuda-checkpoint, cgroup)."""
    publishers: list[Any] = field(default_factory=list)
    """Observers with ``start()``/``stop()`` (the slice publisher): started and stopped with the loop."""

    def _observe(self, snap: NodeSnapshot, events: Sequence[AgentEvent]) -> None:
        self._log_failures(events)
        for g in snap.gpus:
            if g.sample.xids:  # copy-on-write: the metrics thread reads this dict
                self._last_xid = {**self._last_xid, g.sample.gpu_id: g.sample.xids[-1]}
        if self.metrics is not None:
            for e in events:
                self.metrics.observe(e.kind, pauser=e.pauser, latency_ms=e.latency_ms, reason=e.reason)

    def _log_failures(self, events: Sequence[AgentEvent]) -> None:
        now = time.monotonic()
        for e in events:
            if e.kind not in LOGGED_KINDS:
                continue
            key = (e.kind, e.gpu_id, e.lease_id, e.reason)
            if now - self._logged.get(key, -math.inf) < LOG_REPEAT_S:
                continue
            if len(self._logged) >= 1024:
                self._logged = {k: t for k, t in self._logged.items() if now - t < LOG_REPEAT_S}
            self._logged[key] = now
            where = "".join(
                f" {name} {value}"
                for name, value in (("gpu", e.gpu_id), ("lease", e.lease_id), ("pauser", e.pauser))
                if value
            )
            log.warning("%s%s: %s", e.kind, where, e.reason)

    def gauges(self) -> AgentGauges:
        view = gauges_of(self.agent.snapshot(), last_xid=dict(self._last_xid), reporter=self.reporter)
        return AgentGauges(
            view.gpus,
            view.workloads_by_state,
            view.gateway_connected,
            view.outbox_events,
            tick_seconds=self.agent.last_tick_s,
            pausers=tuple((name, not why) for name, why in self.pauser_status.items()),
        )

    def start(self, *, metrics_host: str = "127.0.0.1", metrics_port: int | None = 9400) -> None:
        """Bind ``/metrics`` first, then start the threads: a port that is taken (dcgm-exporter's
        9400) or an address that is not this host's raises `OSError` with nothing started."""
        if metrics_port is not None:
            self.metrics = AgentMetrics(self.agent.config.node, self.gauges)
            self._server, self.metrics_port = self.metrics.serve(host=metrics_host, port=metrics_port)
        self.agent.observers.append(self._observe)
        if self.reporter is not None:
            self.agent.observers.append(self.reporter)
            self.reporter.start()
        if self.scraper is not None:
            self.scraper.start()
        for pub in self.publishers:
            self.agent.observers.append(pub)
            pub.start()
        self._thread = threading.Thread(
            target=self.agent.run,
            args=(self._stop,),
            name=f"gpupool-agent-{self.agent.config.node}",
            daemon=True,
        )
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.agent.close()
        for pub in self.publishers:
            pub.stop()
        if self.scraper is not None:
            self.scraper.stop()
        if self.reporter is not None:
            self.reporter.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        close = getattr(self.source, "close", None)
        if callable(close):
            close()


DEFAULT_EVICTION = EvictionPolicy()
"""An ended ledger lease frees its holder's memory (see `gpupool.agent.evict`)."""


def build_runtime(
    *,
    node: str,
    gateway: str | None,
    token: str,
    devices: str = "simulated",
    gpus: int = 2,
    config: AgentConfig | None = None,
    engines: Sequence[Engine] = (),
    workloads: Sequence[Workload] = (),
    source: DeviceSource | None = None,
    mps: Sequence[MpsGpu] = (),
    eviction: EvictionPolicy | None = DEFAULT_EVICTION,
    mps_log_root: str | None = None,
    evict_pod: Callable[[str, str], object] | None = None,
) -> AgentRuntime:
    clock = FunctionClock(time.monotonic)
    src = source if source is not None else open_source(devices, node=node, gpus=gpus)
    reporter = GatewayReporter(gateway, node=node, token=token) if gateway else None
    scraper = EngineScraper(engines, clock=clock) if engines else None
    pausers = default_pausers(clock=clock)
    agent = NodeAgent(
        config or AgentConfig(node),
        src,
        pausers,
        clock=clock,
        engines=scraper,
        ledger=reporter,
        mps=(MpsSupervisor(mps, log_root=mps_log_root) if mps_log_root else MpsLimitTable(mps))
        if mps
        else None,
        eviction=eviction,
        evict_pod=evict_pod,
    )
    for w in workloads:
        agent.register(w)
    return AgentRuntime(agent, src, reporter, scraper, pauser_status=availability(pausers))


def _card_mib(model: str) -> int:
    """The catalogue's full-card memory (MIG layouts may leave some of it unsliced); 0 if unknown."""
    from gpupool.hardware.catalogue import gpu_model

    try:
        return gpu_model(model).memory_mib if model else 0
    except ValueError:  # UnknownGpuModelError
        return 0


def source_for_slices(node: str, slices: Sequence[Slice]) -> ScriptedSource:
    """An in-memory node with one GPU per ``gpu_id`` of ``slices`` on ``node`` (total VRAM = the card's
    catalogue memory, or the sum of its slices if larger; MIG instances become `GpuSample.instances`)."""
    by_gpu: dict[str, list[Slice]] = {}
    for s in slices:
        if s.node == node:
            by_gpu.setdefault(s.gpu_id, []).append(s)
    samples = []
    for gpu_id, group in sorted(by_gpu.items(), key=lambda kv: (kv[1][0].gpu_index, kv[0])):
        first = group[0]
        instances = tuple(
            GpuSample(
                s.id,
                s.gpu_index,
                0,
                s.capacity.vram_mib,
                uuid=s.uuid,
                model=s.gpu_model,
                mig_profile=s.profile,
                gi_id=i,
                engine_active_ratio=0.0,
            )
            for i, s in enumerate(sorted(group, key=lambda s: s.id))
            if s.kind is SliceKind.MIG
        )
        samples.append(
            GpuSample(
                gpu_id,
                first.gpu_index,
                0,
                max(sum(s.capacity.vram_mib for s in group), _card_mib(first.gpu_model)),
                uuid=first.uuid or f"GPU-{gpu_id.replace('/', '-')}",
                model=first.gpu_model,
                temperature_c=40,
                util_pct=None if instances else 0,
                power_mw=60_000,
                instances=instances,
            )
        )
    return ScriptedSource(samples)


def start_simulated_agents(
    gateway: str,
    *,
    token: str,
    slices: Sequence[Slice] = (),
    cluster: Any | None = None,
    period_s: float = 0.2,
    metrics: bool = False,
    engines: Sequence[Engine] = (),
) -> list[AgentRuntime]:
    """One agent per node, reporting to ``gateway`` (what ``make run`` starts inside the demo): the
    nodes of ``cluster`` (a ``gpupool.adapters.simulated.SimulatedCluster``, read through its device
    source) or else of ``slices`` (in-memory nodes). Stop them with `AgentRuntime.stop`."""
    out: list[AgentRuntime] = []
    nodes = sorted(cluster.nodes()) if cluster is not None else sorted({s.node for s in slices})
    for node in nodes:
        src: DeviceSource = (
            open_source("simulated", node=node, cluster=cluster)
            if cluster is not None
            else source_for_slices(node, slices)
        )
        rt = build_runtime(
            node=node,
            gateway=gateway,
            token=token,
            config=AgentConfig(node, period_s=period_s),
            source=src,
            engines=[e for e in engines if e.gpu_id.startswith(f"{node}/")],
        )
        rt.start(metrics_port=0 if metrics else None)
        out.append(rt)
    return out
