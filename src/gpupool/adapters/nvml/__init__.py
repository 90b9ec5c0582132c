"""NVML device source (``nvidia-ml-py``, module ``pynvml``, imported lazily).

Public API:
- ``NvmlDeviceSource(node, *, nvml=None, clock=time.monotonic)``: a ``gpupool.hardware.devices.DeviceSource``;
  ``nvml`` is any pynvml-shaped module (the real one by default, or ``FakeNvml`` built from a fixture).
- ``FakeNvml.from_fixture(path_or_dict)``: replays a fixture (tests/fixtures/nvml/*.json,
  hand-written from reference facts; ``record`` dumps real ones in the same format).
- ``record(nvml=None) -> dict``: dump real readings in the fixture format
  (CLI: ``python -m gpupool.adapters.nvml.record OUT.json``).
- ``load_pynvml()``: the lazy import; raises ``NvmlUnavailableError`` when the library is missing.
"""

from gpupool.adapters.nvml.record import record
from gpupool.adapters.nvml.replay import FakeNvml
from gpupool.adapters.nvml.source import NvmlDeviceSource, NvmlUnavailableError, load_pynvml

__all__ = ["FakeNvml", "NvmlDeviceSource", "NvmlUnavailableError", "load_pynvml", "record"]
