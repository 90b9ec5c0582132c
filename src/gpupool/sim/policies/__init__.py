"""Simulator placement policies, selected by name (`SIM_POLICIES`, `get_sim_policy`).

Each policy is a small class over the vectorised node state (see `base`); a fresh instance per run.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core.errors import InvalidInput
from gpupool.sim.policies.balance import FGDBalanceMemPolicy, FGDBalancePolicy, FGDReserveBalancePolicy
from gpupool.sim.policies.base import SimPolicy
from gpupool.sim.policies.baselines import (
    BestFitPolicy,
    ClusteringPolicy,
    DotProdPolicy,
    PackingPolicy,
    RandomPolicy,
    SeedBestFitPolicy,
)
from gpupool.sim.policies.core import CoreFragGradientPolicy
from gpupool.sim.policies.fgd import FGDPolicy
from gpupool.sim.policies.ours import (
    FGDCapacityPolicy,
    FGDReserveCpuPolicy,
    FGDReservePolicy,
    FGDReserveServablePolicy,
    FragBestFitPolicy,
)

SIM_POLICIES: dict[str, Callable[[], SimPolicy]] = {
    RandomPolicy.name: RandomPolicy,
    DotProdPolicy.name: DotProdPolicy,
    ClusteringPolicy.name: ClusteringPolicy,
    PackingPolicy.name: PackingPolicy,
    BestFitPolicy.name: BestFitPolicy,
    FGDPolicy.name: FGDPolicy,
    SeedBestFitPolicy.name: SeedBestFitPolicy,
    FGDCapacityPolicy.name: FGDCapacityPolicy,
    FGDReservePolicy.name: FGDReservePolicy,
    FragBestFitPolicy.name: FragBestFitPolicy,
    FGDReserveCpuPolicy.name: FGDReserveCpuPolicy,
    FGDReserveServablePolicy.name: FGDReserveServablePolicy,
    FGDReserveBalancePolicy.name: FGDReserveBalancePolicy,
    FGDBalancePolicy.name: FGDBalancePolicy,
    FGDBalanceMemPolicy.name: FGDBalanceMemPolicy,
    CoreFragGradientPolicy.name: CoreFragGradientPolicy,
}


DEFAULT_SIM_POLICY = FGDBalanceMemPolicy.name
"""The simulator's default (``gpupool sim fgd``, the variant report); see `gpupool.sim.policies.balance`."""


def get_sim_policy(name: str) -> SimPolicy:
    try:
        return SIM_POLICIES[name]()
    except KeyError:
        raise InvalidInput("policy", name, f"known policies: {', '.join(SIM_POLICIES)}") from None


__all__ = ["DEFAULT_SIM_POLICY", "SIM_POLICIES", "SimPolicy", "get_sim_policy"]
