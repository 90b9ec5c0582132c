"""``core-frag-gradient``: the simulator hands every GPU pod's choice to the core `Allocator`.

Role: show what the core's own policy (`gpupool.core.policies.fraggradient`, which holds no node
CPU and learns the mix online) does on the FGD experiment, through the real allocation path. The
engine builds the core allocator with `CORE_POLICY`, filters nodes as for every policy (CPU,
memory, GPU model, enough free GPUs) and calls ``Allocator.allocate`` with ``Request.nodes`` = the
feasible nodes (the Kubernetes-filter mechanism); the lease says the node and the cards, and the
mirror is booked from it. The core decides alone: its slice order (ties by slice id, i.e. node
name, not the seed's node order), its N-GPU rule (fewest free whole cards first) and its learned mix.

CPU-only pods never reach the core (a core request needs a GPU): they take FGD's choice, as in
every FGD-based policy here. `choose` is only called for them.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.sim.policies.base import Choice, PodView, SimContext, StatelessPolicy
from gpupool.sim.policies.fgd import FGDPolicy


class CoreFragGradientPolicy(StatelessPolicy):
    name: ClassVar[str] = "core-frag-gradient"
    core_policy: ClassVar[str] = "frag-gradient"
    """The core policy the engine builds the allocator with; the engine lets it place GPU pods."""

    def __init__(self) -> None:
        self._cpu_only = FGDPolicy()

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        return self._cpu_only.choose(ctx, pod, feasible)
