"""Simulated GPU cluster: the embedded default device source when no GPU is present.

Public API: ``SimulatedCluster(cluster, plan=None, *, seed=0, clock=None)`` with ``read(node)``,
``read_all()``, ``source(node)`` (a ``DeviceSource``), ``inventory()``, and test hooks ``grant``/``release``
(leases), ``set_activity``, ``force``/``clear``, ``lose``, ``xid``, ``advance``;
``SimulatedCluster.from_specs(cluster, workloads=None, seed=0)`` plans first when workloads are given;
``embedded_default(seed=0)``: the seed's agent platform (A100-80GB + L40S), planned and simulated.
Standard library only.
"""

from gpupool.adapters.simulated.cluster import SimulatedCluster, SimulatedDeviceSource
from gpupool.adapters.simulated.defaults import DEFAULT_CLUSTER, DEFAULT_WORKLOADS, embedded_default

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_WORKLOADS",
    "SimulatedCluster",
    "SimulatedDeviceSource",
    "embedded_default",
]
