"""``fgd-balance-mem`` (the default), ``fgd-balance`` and ``fgd-reserve-balance``: CPU-per-GPU rank
matching while CPU binds, and memory in FGD's "does a pod fit" test.

``fgd-balance-mem`` is ``fgd-balance`` whose FGD score key also asks for memory (section "Memory",
at the end).

``fgd-reserve-balance`` is `fgd-reserve-servable` plus rank matching while CPU binds (below);
``fgd-balance`` is the same without the whole-card reserve while CPU binds (last section).

Role: where the GPU pods' CPU requests are heavy, CPU, not GPU, strands cards: a node with 8 cards
and 96 cores runs out of cores with most cards idle, while a 2-card, 104-core node runs out of
cards with most cores idle. FGD (GPU-only fragmentation) sees neither. This policy routes each pod
to a node whose free CPU per free GPU ranks where the pod's CPU per GPU ranks in the mix, so pods
that ask many cores per card land on nodes with spare cores and pods that ask few land on
core-poor nodes, and it does so only while (a) the free CPU cannot carry the free GPU at the mix's
ratio and (b) the move wastes strictly less usable GPU than the default's choice would.

Keys, per pod:
- while the free CPU carries all the free GPU at the mix's CPU-per-GPU ratio (``cpu_demand /
  demand``, from the shape counts of the pod list): exactly `FGDReserveServablePolicy`;
- otherwise the rank choice: among the placements the whole-card reserve keeps (least shortfall),
  those whose node rank is closest to the pod's rank, then FGD's best integer score, then the
  capacity gain, then node order. Node rank = the share of the cluster's free GPU held by nodes with
  a lower free-CPU-per-free-GPU ratio (midpoint for the node itself; a node with no free GPU ranks
  1). Pod rank = the share of the mix's GPU demand asked by shapes with a lower CPU per GPU
  (midpoint for the pod's own; a CPU-only pod ranks 1, so it goes to the nodes whose GPUs are gone
  or nearly so);
- gate: the rank choice is taken only when its usable-GPU loss is strictly smaller than that of
  `FGDReserveServablePolicy`'s choice (its expected gain is positive); usable GPU of a node =
  ``min(free GPU, free CPU x demand / cpu_demand)``, the GPU the mix could still use there.
  Otherwise the default's choice stands: where every candidate node is CPU-bound (the mix at 3x
  the trace's CPU) the losses are equal and FGD's card packing is kept. With "no larger" instead
  of "strictly smaller" the policy lost to FGD on ``cpu300`` (+0.6 %, median of 10 seeds).

No constants: the ratio, both ranks and the gate come from the pod list's shape counts and the
cluster state. Invariant: on mixes where CPU never binds (the nine published workloads, the default
trace) the choices are `FGDReserveServablePolicy`'s, so its run time and results are unchanged
there. Equal ratios are not pooled: nodes with the same free CPU per free GPU take consecutive
ranks in node order, and a pod takes the midpoint of the first shape with its ratio in the pod
list's shape order (pooling equal ratios into one midpoint measured worse on ``cpu200`` and
``cpu300``). Measurements and the reasons for each key: docs/fgd/README.md, "Why `fgd-reserve`
lost, and the fix", item 4.

The reserve while CPU binds (``fgd-balance``): the whole-card reserve defends free cards (and the CPU
beside them) for the whole-card groups' expected demand, and its gain is the GPU those pods would
fail to get for want of a slot. While the free CPU cannot carry the free GPU at the mix's ratio,
GPU is not what the cluster runs out of: the run ends with idle cards behind exhausted CPU whatever
the placement, a whole-card pod that fails leaves its CPU to the pods that arrive after it, and the
slots the reserve counts are CPU-bound, so defending them only moves CPU from one group to another
(its expected gain is not positive), at the price of FGD's choice. So while CPU binds the default
choice is FGD's best score, then the capacity gain, and rank matching looks at every placement;
where CPU does not bind nothing changes. Measured (median of seeds 42-51): ``cpu300`` 52.06 against
FGD's 52.15 (``fgd-reserve-balance`` 52.18: the reserve cost it the tie), ``cpu200`` 31.61
(32.04), ``cpu200-multi40`` 30.81 (31.06); docs/fgd/README.md, item 5.

Memory (``fgd-balance-mem``): FGD's measure, as the artifact computes it, ignores node memory, so
a placement that leaves a node too little memory for any further pod scores as if its idle cards
were still usable. Where the GPU pods ask little CPU, memory is what strands cards: on the
``cpu0`` variant (GPU pods ask no CPU, 1,088 CPU-only pods ask about 50 GiB each, an 8-card node
has 48 GiB per card) FGD ends with 9 fully free cards behind exhausted memory (seed 42; 13 and 14
at seeds 43 and 44) while 1-GPU pods fail for want of a card. So the default's FGD key uses the
measure with memory in its fit test (`gpupool.sim.frag`, ``memory=True``): a node whose free
memory is below the smallest memory request of a shape's pods cannot host that shape, exactly as
FGD treats CPU. Memory is not part of the artifact's shape key, so "one pod of the shape fits"
is asked of the shape's smallest pod: the test is exact for "no pod of the shape fits" and
needs no constant. Everything else is ``fgd-balance``'s; the reported fragmentation rates stay
the artifact's measure. Measured: docs/fgd/README.md, item 6.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.sim.frag import FragModel, FragTable
from gpupool.sim.policies.base import Choice, PodView, SimContext
from gpupool.sim.policies.fgd import finish, placements
from gpupool.sim.policies.ours import FGDReserveServablePolicy
from gpupool.sim.reserve import WholeCardReserve
from gpupool.sim.trace import MILLI_PER_GPU


class PodRatioRanks:
    """The mix's CPU-per-GPU distribution: rank of a pod = GPU-demand share of lower ratios."""

    def __init__(self, ctx: SimContext) -> None:
        pop = ctx.population or ctx.target
        ratios: list[float] = []
        weights: list[float] = []
        for s, c in zip(pop.shapes, pop.counts, strict=True):
            milli = s.gpu_milli * s.num_gpu
            if milli:
                ratios.append(s.cpu_milli / milli)
                weights.append(float(c * milli))
        r = np.array(ratios or [0.0])
        w = np.array(weights or [1.0])
        order = np.argsort(r, kind="stable")
        self.ratio = r[order]
        share = w[order] / w.sum()
        self.mid = np.cumsum(share) - share / 2

    def rank(self, pod: PodView) -> float:
        if not pod.total_gpu_milli:
            return 1.0
        i = int(np.searchsorted(self.ratio, pod.cpu_milli / pod.total_gpu_milli))
        return float(self.mid[min(i, len(self.mid) - 1)])


def node_ranks(free_gpu_milli: np.ndarray, free_cpu_milli: np.ndarray) -> np.ndarray:
    """Per node: the share of free GPU on nodes with a lower free-CPU-per-free-GPU ratio (midpoint
    for its own; 1 for a node with no free GPU)."""
    g = free_gpu_milli.astype(np.float64)
    c = np.maximum(free_cpu_milli, 0).astype(np.float64)
    has = g > 0
    ratio = np.where(has, c / np.where(has, g, 1.0), np.inf)
    order = np.argsort(ratio, kind="stable")
    cum = np.cumsum(g[order])
    total = cum[-1] if len(cum) and cum[-1] > 0 else 1.0
    out = np.empty(len(g))
    out[order] = (cum - g[order] / 2) / total
    out[~has] = 1.0
    return out


class FGDReserveBalancePolicy(FGDReserveServablePolicy):
    """See the module docstring."""

    name: ClassVar[str] = "fgd-reserve-balance"
    reserve_while_cpu_binds: ClassVar[bool] = True
    """False in `FGDBalancePolicy` and the default `FGDBalanceMemPolicy`: the whole-card reserve
    steps aside while CPU binds."""

    def __init__(self) -> None:
        super().__init__()
        self._ranks: PodRatioRanks | None = None

    def _cpu_binds(self, reserve: WholeCardReserve) -> bool:
        cpu = int(reserve.mirror.cpu_free.sum())
        return cpu * reserve.demand < reserve.free_milli * reserve.cpu_demand

    def _usable_loss(self, ctx: SimContext, reserve: WholeCardReserve, pod: PodView, node: int) -> int:
        """Scaled (x demand x cpu_demand) drop of ``min(free GPU, free CPU x demand / cpu_demand)``."""
        g = int(ctx.frag.free_total[node])
        c = int(ctx.mirror.cpu_free[node])
        before = min(g * reserve.cpu_demand, c * reserve.demand)
        after = min((g - pod.total_gpu_milli) * reserve.cpu_demand, (c - pod.cpu_milli) * reserve.demand)
        return before - after

    def _rank_choice(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        rows, gpus, values = placements(ctx, pod, feasible)
        reserve = self._reserve_table(ctx)
        cards = 1 if pod.is_sharing else pod.num_gpu
        use_reserve = self.reserve_while_cpu_binds
        if use_reserve and not reserve.never_short(cards, pod.total_gpu_milli, pod.cpu_milli):
            if pod.is_sharing:
                taken = (values == MILLI_PER_GPU).astype(np.int64)
            else:
                taken = np.full(len(rows), pod.num_gpu, dtype=np.int64)
            short = reserve.shortfall_after(rows, taken, pod.total_gpu_milli, pod.cpu_milli)
            keep = np.flatnonzero(short == short.min())
            rows, gpus, values = rows[keep], gpus[keep], values[keep]
        if self._ranks is None:
            self._ranks = PodRatioRanks(ctx)
        distance = np.abs(node_ranks(ctx.frag.free_total, ctx.mirror.cpu_free)[rows] - self._ranks.rank(pod))
        keep = np.flatnonzero(distance == distance.min())
        rows, gpus, values = self._fgd_top(ctx, pod, rows[keep], gpus[keep], values[keep])
        best = int(np.argmax(self._cap_gain(ctx, pod, rows, gpus, values)))
        return finish(ctx, pod, int(rows[best]), int(gpus[best]))

    def _capacity_choice(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        """FGD's best integer score, then the capacity gain, then node order (no reserve)."""
        rows, gpus, values = self._fgd_ties(ctx, pod, feasible)
        best = int(np.argmax(self._cap_gain(ctx, pod, rows, gpus, values)))
        return finish(ctx, pod, int(rows[best]), int(gpus[best]))

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        reserve = self._reserve_table(ctx)
        if not self._cpu_binds(reserve):
            return super().choose(ctx, pod, feasible)
        if self.reserve_while_cpu_binds:
            default = super().choose(ctx, pod, feasible)
        else:
            default = self._capacity_choice(ctx, pod, feasible)
        ranked = self._rank_choice(ctx, pod, feasible)
        if ranked[0] == default[0]:
            return ranked
        if self._usable_loss(ctx, reserve, pod, ranked[0]) < self._usable_loss(ctx, reserve, pod, default[0]):
            return ranked
        return default


class FGDBalancePolicy(FGDReserveBalancePolicy):
    """`FGDReserveBalancePolicy` without the whole-card reserve while CPU binds (the default's base).

    While the free CPU cannot carry the free GPU at the mix's ratio, the default's choice is FGD's
    best score, then the capacity gain (`FGDCapacityPolicy`'s keys), and the rank choice keeps the
    placements closest in rank among ALL placements (not only the reserve's); the gate is
    unchanged. Elsewhere it is `FGDReserveServablePolicy`, choice for choice. Why: module
    docstring, "The reserve while CPU binds"."""

    name: ClassVar[str] = "fgd-balance"
    reserve_while_cpu_binds: ClassVar[bool] = False


class FGDBalanceMemPolicy(FGDBalancePolicy):
    """`FGDBalancePolicy` whose FGD score key asks for memory too (the default; module docstring,
    "Memory"). Keeps its own memory-aware table over the engine's per-node statistics, refreshed
    after every placement (after the engine's)."""

    name: ClassVar[str] = "fgd-balance-mem"

    def __init__(self) -> None:
        super().__init__()
        self._mem_frag: FragTable | None = None

    def _fgd_table(self, ctx: SimContext) -> FragTable:
        if self._mem_frag is None or self._mem_frag.mirror is not ctx.mirror:
            model = FragModel(ctx.target, ctx.mirror.models, memory=True)
            self._mem_frag = FragTable(model, ctx.mirror, stats_of=ctx.frag)
        return self._mem_frag

    def placed(self, ctx: SimContext, pod: PodView, choice: Choice) -> None:
        super().placed(ctx, pod, choice)
        self._fgd_table(ctx).refresh(choice[0])
