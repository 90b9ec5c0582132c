"""`GatewayMetrics`: the gateway's Prometheus exposition (prometheus-client), in its own registry.

Scrape-time gauges read the `LeaseController` directly (no double bookkeeping):
``gpupool_leases{band,state}`` (``{band,state,tenant}`` only with ``tenant_labels=True``, i.e.
``gpupool serve --metrics-tenant-labels``: tenant names are not shown to whoever can scrape by default),
``gpupool_slice_capacity_{vram_mib,compute_milli}{node,gpu,slice,kind}``,
``gpupool_slice_granted_{vram_mib,compute_milli}{...}``, ``gpupool_gpu_granted_vram_mib{node,gpu}``,
``gpupool_queue_depth{band}``, ``gpupool_admission_total{band,outcome}`` (``outcome``: an admission
code, ``granted_from_queue``, ``failed``, or ``shed_queue_full`` for a request shed at once because
its band's queue was full, apart from ``shed``), ``gpupool_preemptions_total``,
``gpupool_backpressure{gpu}`` (1 = PAUSED by the watermark machine), ``gpupool_request_leases{model}``,
``gpupool_store_commits_total`` / ``gpupool_store_writes_total`` (group-commit batches and writes).
Observed: ``gpupool_lease_events_total{kind,band}``, ``gpupool_queue_wait_seconds{band}``,
``gpupool_proxy_requests_total{model,status}``, ``gpupool_proxy_ttft_seconds{model}``,
``gpupool_proxy_latency_seconds{model}``.

No module-level state: every `GatewayMetrics` owns a fresh `CollectorRegistry`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    generate_latest,
)
from prometheus_client import (
    Counter as PCounter,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gpupool.core.controller import LeaseController
from gpupool.core.ports import GatewayEvent
from gpupool.core.priority import band

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class _ControllerCollector(Collector):
    def __init__(
        self, c: LeaseController, commits: Callable[[], tuple[int, int]], *, tenant_labels: bool
    ) -> None:
        self.c = c
        self.commits = commits
        self.tenant_labels = tenant_labels

    def collect(self) -> Iterator[Any]:
        c = self.c
        names = ["band", "state", "tenant"] if self.tenant_labels else ["band", "state"]
        leases = GaugeMetricFamily("gpupool_leases", "Active leases", labels=names)
        counts: Counter[tuple[str, ...]] = Counter()
        for x in c.leases():
            key = (band(x.priority), x.state.value)
            counts[(*key, x.request.tenant) if self.tenant_labels else key] += 1
        for k, n in sorted(counts.items()):
            leases.add_metric(list(k), n)
        yield leases
        labels = ["node", "gpu", "slice", "kind"]
        cap_v = GaugeMetricFamily(
            "gpupool_slice_capacity_vram_mib", "Slice VRAM capacity (MiB)", labels=labels
        )
        cap_c = GaugeMetricFamily(
            "gpupool_slice_capacity_compute_milli", "Slice compute (milli-GPU)", labels=labels
        )
        gr_v = GaugeMetricFamily(
            "gpupool_slice_granted_vram_mib", "VRAM granted on the slice (MiB)", labels=labels
        )
        gr_c = GaugeMetricFamily(
            "gpupool_slice_granted_compute_milli", "Compute granted (milli-GPU)", labels=labels
        )
        gpu_v = GaugeMetricFamily(
            "gpupool_gpu_granted_vram_mib", "VRAM granted per GPU (MiB)", labels=["node", "gpu"]
        )
        per_gpu: Counter[tuple[str, str]] = Counter()
        for st in c.allocator.states():
            s = st.slice
            lab = [s.node, s.gpu_id, s.id, s.kind.value]
            cap_v.add_metric(lab, s.capacity.vram_mib)
            cap_c.add_metric(lab, s.capacity.compute_milli)
            gr_v.add_metric(lab, st.granted.vram_mib)
            gr_c.add_metric(lab, st.granted.compute_milli)
            per_gpu[(s.node, s.gpu_id)] += st.granted.vram_mib
        for gk, v in sorted(per_gpu.items()):
            gpu_v.add_metric(list(gk), v)
        yield from (cap_v, cap_c, gr_v, gr_c, gpu_v)
        q = GaugeMetricFamily("gpupool_queue_depth", "Requests waiting in admission", labels=["band"])
        for b, n in sorted(c.queue.depth_by_band().items()):
            q.add_metric([b], n)
        yield q
        adm = CounterMetricFamily(
            "gpupool_admission", "Admission decisions by outcome", labels=["band", "outcome"]
        )
        for (b, o), n in sorted(c.outcomes.items()):
            adm.add_metric([b, o], n)
        yield adm
        yield CounterMetricFamily(
            "gpupool_preemptions", "Leases preempted for higher priority", value=c.preemptions
        )
        bp = GaugeMetricFamily(
            "gpupool_backpressure", "1 = GPU paused by the watermark machine", labels=["gpu"]
        )
        paused = c.paused_gpus()
        for gpu in sorted({st.slice.gpu_id for st in c.allocator.states()}):
            bp.add_metric([gpu], 1 if gpu in paused else 0)
        yield bp
        rl = GaugeMetricFamily("gpupool_request_leases", "Active request leases per model", labels=["model"])
        per_model: Counter[str] = Counter(x.request.model for x in c.request_leases())
        for m in sorted(c.models()):
            rl.add_metric([m], per_model[m])
        yield rl
        batches, writes = self.commits()
        yield CounterMetricFamily("gpupool_store_commits", "Group-commit batches made durable", value=batches)
        yield CounterMetricFamily("gpupool_store_writes", "Lease writes made durable", value=writes)


class _ProxyCollector(Collector):
    """``gpupool_proxy_requests`` (counter, model x status), ``gpupool_proxy_ttft_seconds`` and
    ``gpupool_proxy_latency_seconds`` (histograms per model, `LATENCY_BUCKETS`), kept as plain counts
    and exposed at collection: the same series prometheus_client's own metrics would expose."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}
        self.hists: dict[tuple[str, str], list[float]] = {}
        """(metric, model) -> [count per bucket ..., count above the last, sum]."""

    def add(self, observations: list[tuple[str, int, float | None, float]]) -> None:
        n = len(LATENCY_BUCKETS)
        for model, status, ttft_s, latency_s in observations:
            key = (model, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            for metric, v in (("ttft", ttft_s), ("latency", latency_s)):
                if v is None:
                    continue
                h = self.hists.get((metric, model))
                if h is None:
                    h = self.hists[(metric, model)] = [0.0] * (n + 2)
                h[bisect_left(LATENCY_BUCKETS, v)] += 1
                h[n + 1] += v

    def collect(self) -> Iterator[Any]:
        c = CounterMetricFamily(
            "gpupool_proxy_requests", "Proxied OpenAI requests", labels=["model", "status"]
        )
        for (model, status), v in sorted(self.requests.items()):
            c.add_metric([model, status], v)
        yield c
        n = len(LATENCY_BUCKETS)
        for metric, doc in (("ttft", "Proxy time to first byte"), ("latency", "Proxy request latency")):
            fam = HistogramMetricFamily(f"gpupool_proxy_{metric}_seconds", doc, labels=["model"])
            for (m, model), h in sorted(self.hists.items()):
                if m != metric:
                    continue
                cum, buckets = 0.0, []
                for le, k in zip((*(str(b) for b in LATENCY_BUCKETS), "+Inf"), h[: n + 1], strict=True):
                    cum += k
                    buckets.append((le, cum))
                fam.add_metric([model], buckets, sum_value=h[n + 1])
            yield fam


PROXY_FOLD_EVERY = 4096
"""Pending proxy observations folded into the metrics at least this often (bounds the memory)."""


class GatewayMetrics:
    def __init__(
        self,
        controller: LeaseController,
        *,
        commits: Callable[[], tuple[int, int]] = lambda: (0, 0),
        tenant_labels: bool = False,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_ControllerCollector(controller, commits, tenant_labels=tenant_labels))
        self.events = PCounter(
            "gpupool_lease_events", "Lease and admission events", ["kind", "band"], registry=self.registry
        )
        self.wait = Histogram(
            "gpupool_queue_wait_seconds",
            "Time queued before a grant",
            ["band"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self._proxy = _ProxyCollector()
        self.registry.register(self._proxy)
        self._pending: list[tuple[str, int, float | None, float]] = []
        self._event_children: dict[tuple[str, str], Any] = {}

    def observe_event(self, e: GatewayEvent) -> None:
        """Per event (two per lease round trip): the counter's child for (kind, band) is looked up
        once and kept (`labels` validates and locks on every call)."""
        b = band(e.lease.priority) if e.lease is not None else ""
        child = self._event_children.get((e.kind, b))
        if child is None:
            child = self._event_children[(e.kind, b)] = self.events.labels(e.kind, b)
        child.inc()
        if e.kind == "granted" and e.ticket and e.lease is not None:
            self.wait.labels(b).observe(e.wait_s)

    def observe_proxy(self, model: str, status: int, ttft_s: float | None, latency_s: float) -> None:
        """Per proxied request: one list append; `fold` counts them into the proxy's series at the
        next scrape (`render`) or every `PROXY_FOLD_EVERY` requests (no prometheus_client call, and
        no lock, on the request path)."""
        self._pending.append((model, status, ttft_s, latency_s))
        if len(self._pending) >= PROXY_FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Count the pending proxy observations (exact: each is counted once)."""
        pending, self._pending = self._pending, []
        self._proxy.add(pending)

    def render(self) -> tuple[bytes, str]:
        self.fold()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
