"""``gpupool_tidal_*`` series for the gateway's ``/metrics``, read from a `TidalPlane` at scrape time.

- ``gpupool_tidal_mode{mode}`` 1 for the current mode (day | night), 0 for the other;
- ``gpupool_tidal_demand_per_minute`` measured P0+P1 arrivals per minute (the controller's input);
- ``gpupool_tidal_p2_share_ratio``, ``gpupool_tidal_p2_held_mib``: the P2 share and what P2 holds;
- ``gpupool_tidal_refused_total{why}``: P2 admissions refused (placement leases: day-reservation |
  night-share | holdback; requests to online engines: day-strict | day-lending | holdback);
- ``gpupool_tidal_lending_level``: the day-lending guard's level (0 with ``day_policy: strict``);
- ``gpupool_tidal_night_path_total{path}`` and ``gpupool_tidal_night_path_ms{path,quantile}``: how
  night P0 arrivals got capacity (free | preempt | queued | refused) and what displaced P2 work went
  through (pause | requeue), with p50/p99 over the newest samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupool.core.tidal.modes import Mode
from gpupool.core.tidal.plane import TidalPlane


class TidalCollector(Collector):
    def __init__(self, plane: TidalPlane) -> None:
        self.plane = plane

    def collect(self) -> Iterator[Any]:
        p = self.plane
        now = p.clock.now()
        mode = GaugeMetricFamily("gpupool_tidal_mode", "1 for the current tidal mode", labels=["mode"])
        for m in Mode:
            mode.add_metric([m.value], 1.0 if p.mode is m else 0.0)
        yield mode
        yield GaugeMetricFamily(
            "gpupool_tidal_demand_per_minute",
            "Measured P0+P1 arrivals per minute",
            value=p.meter.per_minute(now),
        )
        held, _ = p.p2_usage()
        yield GaugeMetricFamily(
            "gpupool_tidal_p2_share_ratio", "Pool share P2 may hold now", value=p.p2_share()
        )
        yield GaugeMetricFamily("gpupool_tidal_p2_held_mib", "VRAM MiB held by P2 leases", value=held)
        yield GaugeMetricFamily(
            "gpupool_tidal_lending_level",
            "Share of P2 requests lent to online engines by day",
            value=p.guard.level,
        )
        refused = CounterMetricFamily(
            "gpupool_tidal_refused", "P2 placement leases refused by tidal admission", labels=["why"]
        )
        for why in ("day-reservation", "night-share", "holdback", "day-strict", "day-lending"):
            refused.add_metric([why], p.refusals.get(why, 0))
        yield refused
        total = CounterMetricFamily(
            "gpupool_tidal_night_path", "Night P0 arrivals and P2 displacements by path", labels=["path"]
        )
        ms = GaugeMetricFamily(
            "gpupool_tidal_night_path_ms",
            "Night path time (ms), over the newest samples",
            labels=["path", "quantile"],
        )
        for path, st in p.paths.items():
            total.add_metric([path], st.count)
            for q in (0.5, 0.99):
                v = st.quantile(q)
                if v is not None:
                    ms.add_metric([path, str(q)], v)
        yield total
        yield ms


__all__ = ["TidalCollector"]
