"""The node agent's ``/metrics``: dcgm-exporter-compatible GPU series plus gpupool's own agent series.

Role: a prometheus_client registry with one custom collector that renders the newest node view at
scrape time (so a tick costs nothing here), and counters/histograms fed by agent events.

Names and labels follow dcgm-exporter where the meaning is the same (gpu-facts section 6):
``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_GPU_UTIL`` (%, never on MIG
instances), ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio, works per MIG instance), ``DCGM_FI_DEV_GPU_TEMP``
(degC), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_XID_ERRORS`` (value of the last XID, with
``err_code`` and ``err_msg`` as dcgm-exporter adds them); labels ``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName`` (NVML's device name), ``hostname`` and, on MIG instances only,
``GPU_I_PROFILE`` and ``GPU_I_ID``: a MIG series carries its parent GPU's ``UUID`` and index, as
dcgm-exporter's do. gpupool's own series are prefixed ``gpupool_agent_``.

Invariants: unknown values are omitted (never exported as 0); label sets are exactly those of
dcgm-exporter for the same device kind; prometheus_client is imported lazily (first use).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    15.0,
    60.0,
)


@dataclass(frozen=True, slots=True)
class GpuGauges:
    """One GPU or MIG instance as the metrics page shows it."""

    index: int
    uuid: str
    fb_used_mib: int
    fb_total_mib: int
    model: str = ""
    util_pct: int | None = None
    engine_active_ratio: float | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    mig_profile: str = ""
    gi_id: int | None = None
    last_xid: int | None = None
    pci_bus_id: str = ""
    # gpupool's own
    gpu_id: str = ""
    effective_used_mib: int | None = None
    paused: bool = False
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class AgentGauges:
    gpus: tuple[GpuGauges, ...]
    workloads_by_state: tuple[tuple[str, int], ...] = ()
    gateway_connected: bool | None = None
    outbox_events: int = 0
    tick_seconds: float | None = None
    pausers: tuple[tuple[str, bool], ...] = ()
    """(pauser name, usable on this machine)."""


XID_NAMES = {
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}
"""``err_msg`` of the XIDs the agent acts on (NVIDIA's XID catalogue names, as dcgm-exporter prints them);
any other code is ``Unknown Error``."""


def xid_labels(xid: float) -> dict[str, str]:
    """dcgm-exporter's extra labels on ``DCGM_FI_DEV_XID_ERRORS``: ``err_code`` and ``err_msg``."""
    code = int(xid)
    if code == 0:  # no XID since the agent started: dcgm-exporter's 0 carries no message
        return {"err_code": "0"}
    return {"err_code": str(code), "err_msg": XID_NAMES.get(code, "Unknown Error")}


def _labels(g: GpuGauges, hostname: str) -> dict[str, str]:
    labels = {
        "gpu": str(g.index),
        "UUID": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "device": f"nvidia{g.index}",
        "modelName": g.model,
        "hostname": hostname,
    }
    if g.mig_profile:
        labels["GPU_I_PROFILE"] = g.mig_profile
        labels["GPU_I_ID"] = "" if g.gi_id is None else str(g.gi_id)
    return labels


class _NodeCollector:
    def __init__(self, hostname: str, provider: Callable[[], AgentGauges]) -> None:
        self.hostname = hostname
        self.provider = provider

    def describe(self) -> list[Any]:
        return []  # no fixed description: the collector is unchecked at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric

        view = self.provider()

        def family(
            name: str,
            doc: str,
            pick: Callable[[GpuGauges], float | None],
            typ: str = "gauge",
            extra: Callable[[float], dict[str, str]] | None = None,
        ) -> Any:
            m = Metric(name, doc, typ)
            for g in view.gpus:
                v = pick(g)
                if v is not None:
                    labels = _labels(g, self.hostname)
                    if extra is not None:
                        labels.update(extra(v))
                    m.add_sample(name, labels, float(v))
            return m

        yield family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.fb_used_mib)
        yield family(
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
            lambda g: max(0, g.fb_total_mib - g.fb_used_mib),
        )
        yield family(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %).",
            lambda g: None if g.mig_profile else g.util_pct,
        )
        yield family(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            lambda g: g.engine_active_ratio,
        )
        yield family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c)
        yield family(
            "DCGM_FI_DEV_POWER_USAGE",
            "Power draw (in W).",
            lambda g: None if g.power_mw is None else g.power_mw / 1000.0,
        )
        yield family(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            lambda g: g.last_xid,
            extra=xid_labels,
        )
        yield family(
            "gpupool_agent_watermark_paused",
            "1 while the watermark machine holds batch (P2) work on this GPU paused.",
            lambda g: 1 if g.paused else 0,
        )
        yield family(
            "gpupool_agent_effective_vram_used_mib",
            "VRAM the watermarks see: NVML minus unused engine KV reservations, floored by the lease ledger.",
            lambda g: g.effective_used_mib,
        )
        yield family(
            "gpupool_agent_gpu_healthy",
            "0 once an NVML error or device XID was seen.",
            lambda g: 1 if g.healthy else 0,
        )
        m = Metric("gpupool_agent_workloads", "P2 workloads known to the agent, by state.", "gauge")
        for state, n in view.workloads_by_state:
            m.add_sample("gpupool_agent_workloads", {"state": state, "hostname": self.hostname}, float(n))
        yield m
        if view.gateway_connected is not None:
            m = Metric(
                "gpupool_agent_gateway_connected", "1 when the last post to the gateway succeeded.", "gauge"
            )
            m.add_sample(
                "gpupool_agent_gateway_connected",
                {"hostname": self.hostname},
                1.0 if view.gateway_connected else 0.0,
            )
            yield m
            m = Metric("gpupool_agent_outbox_events", "Events waiting to be sent to the gateway.", "gauge")
            m.add_sample(
                "gpupool_agent_outbox_events", {"hostname": self.hostname}, float(view.outbox_events)
            )
            yield m
        if view.pausers:
            m = Metric("gpupool_agent_pauser_available", "1 when the pauser is usable on this node.", "gauge")
            for name, ok in view.pausers:
                m.add_sample(
                    "gpupool_agent_pauser_available",
                    {"pauser": name, "hostname": self.hostname},
                    1.0 if ok else 0.0,
                )
            yield m
        if view.tick_seconds is not None:
            m = Metric("gpupool_agent_last_tick_seconds", "Wall time of the last control-loop tick.", "gauge")
            m.add_sample("gpupool_agent_last_tick_seconds", {"hostname": self.hostname}, view.tick_seconds)
            yield m


class AgentMetrics:
    """The registry behind the agent's ``/metrics`` page."""

    def __init__(self, hostname: str, provider: Callable[[], AgentGauges]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.hostname = hostname
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(hostname, provider))
        self.pauses = Counter(
            "gpupool_agent_pauses",
            "Successful pause/resume actions, by pauser and action.",
            ["pauser", "action", "hostname"],
            registry=self.registry,
        )
        self.failures = Counter(
            "gpupool_agent_pauser_failures",
            "Failed or refused pauser actions, by pauser.",
            ["pauser", "hostname"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpupool_agent_pause_latency_seconds",
            "Time a pauser took to pause or resume a workload.",
            ["pauser", "action", "hostname"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.transitions = Counter(
            "gpupool_agent_watermark_transitions",
            "Watermark PAUSE/RESUME transitions.",
            ["signal", "hostname"],
            registry=self.registry,
        )
        self.revocations = Counter(
            "gpupool_agent_revocations",
            "Leases the agent reported revoked (job requeued).",
            ["reason", "hostname"],
            registry=self.registry,
        )

    def observe(self, kind: str, *, pauser: str = "", latency_ms: float = 0.0, reason: str = "") -> None:
        """Count one agent event (see `gpupool.agent.loop.AgentEvent.kind`)."""
        h = self.hostname
        if kind in ("paused", "resumed"):
            action = "pause" if kind == "paused" else "resume"
            self.pauses.labels(pauser, action, h).inc()
            self.latency.labels(pauser, action, h).observe(latency_ms / 1000.0)
        elif kind == "pauser_failure":
            self.failures.labels(pauser or "unknown", h).inc()
        elif kind in ("watermark_pause", "watermark_resume"):
            self.transitions.labels(kind.removeprefix("watermark_"), h).inc()
        elif kind == "revoke":
            self.revocations.labels("unhealthy" if "unhealthy" in reason else "pressure", h).inc()

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 9400,
        max_connections: int | None = None,
        idle_timeout_s: float | None = None,
    ) -> tuple[Any, int]:
        """Start ``/metrics`` on a background thread; returns (server, bound port). Port 0 = any free.

        prometheus_client's own server (``start_http_server``) answers HEAD with 405; this one answers
        it as GET without the body (``curl -I``, uptime monitors), everything else as prometheus_client.
        Connections are bounded (`gpupool.adapters.metrics.httpserver`: ``max_connections`` at once,
        503 past it; a read waiting longer than ``idle_timeout_s`` closes the connection)."""
        import socket
        import threading
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client.exposition import make_wsgi_app

        from gpupool.adapters.metrics import httpserver

        inner = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if environ["REQUEST_METHOD"] != "HEAD":
                return inner(environ, start_response)
            got: list[Any] = []
            body = b"".join(inner({**environ, "REQUEST_METHOD": "GET"}, lambda *a: got.extend(a)))
            start_response(got[0], [*got[1], ("Content-Length", str(len(body)))])
            return []

        class Quiet(WSGIRequestHandler):
            timeout = httpserver.IDLE_TIMEOUT_S if idle_timeout_s is None else idle_timeout_s

            def log_message(self, format: str, *args: Any) -> None:
                """Log nothing (as prometheus_client's server)."""

        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        limit = httpserver.MAX_CONNECTIONS if max_connections is None else max_connections
        server_class = httpserver.bounded_server_class(family, max_connections=limit)
        server: Any = make_server(host, port, app, server_class, handler_class=Quiet)
        threading.Thread(target=server.serve_forever, name="gpupool-metrics", daemon=True).start()
        return server, int(server.server_port)


def gauges_from(gpus: Sequence[GpuGauges], **extra: Any) -> AgentGauges:
    return AgentGauges(tuple(gpus), **extra)
