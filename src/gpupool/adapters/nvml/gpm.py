"""MIG engine activity through NVML GPM (Hopper and newer): graphics/compute engine busy % per GPU instance.

Role: NVML has no utilisation for MIG devices (``nvmlDeviceGetUtilizationRates`` is NOT_SUPPORTED with MIG
on). GPM's ``NVML_GPM_METRIC_GRAPHICS_UTIL`` between two samples of one GPU instance is the NVML-side
equivalent of DCGM's GR_ENGINE_ACTIVE (fact sheet section 6).

Invariants: the first reading of an instance is None (two samples are needed); any failure (GPM not
supported, e.g. Ampere; an old driver; a missing symbol) disables GPM for that parent GPU and yields None;
samples are freed when replaced and on ``close``.
"""

from __future__ import annotations

import contextlib
from typing import Any


class GpmSampler:
    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._prev: dict[tuple[str, int], Any] = {}
        self._supported: dict[str, bool] = {}

    def _parent_supported(self, key: str, parent: Any) -> bool:
        if key not in self._supported:
            try:
                self._supported[key] = bool(self._nv.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice)
            except (AttributeError, TypeError, self._nv.NVMLError):
                self._supported[key] = False
        return self._supported[key]

    def engine_active_pct(self, key: str, parent: Any, gpu_instance_id: int) -> int | None:
        """Graphics-engine busy % of one GPU instance since the previous call, or None."""
        nv = self._nv
        if not self._parent_supported(key, parent):
            return None
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmMigSampleGet(parent, gpu_instance_id, sample)
        except (AttributeError, TypeError, nv.NVMLError):
            self._supported[key] = False
            return None
        prev = self._prev.get((key, gpu_instance_id))
        self._prev[(key, gpu_instance_id)] = sample
        if prev is None:
            return None
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1 = prev
            mg.sample2 = sample
            mg.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
            nv.nvmlGpmMetricsGet(mg)
            value = float(mg.metrics[0].value)
        except (AttributeError, TypeError, nv.NVMLError):
            return None
        finally:
            with contextlib.suppress(AttributeError, TypeError, nv.NVMLError):
                nv.nvmlGpmSampleFree(prev)
        return max(0, min(100, round(value)))

    def close(self) -> None:
        for sample in self._prev.values():
            with contextlib.suppress(AttributeError, TypeError, self._nv.NVMLError):
                self._nv.nvmlGpmSampleFree(sample)
        self._prev.clear()
