"""``fgd-balance`` (the simulator's default) and ``fgd-reserve-balance``: rank matching while CPU binds.

Proves, on hand-worked tiny clusters: the node and pod ranks are the documented shares; while the
free CPU cannot carry the free GPU at the mix's ratio, a CPU-heavy pod goes to the CPU-rich node, a
CPU-light pod to the CPU-poor one and a CPU-only pod to the CPU-rich one, whatever FGD prefers;
while CPU binds ``fgd-balance`` takes no advice from the whole-card reserve, which
``fgd-reserve-balance`` follows against FGD; where CPU does not bind, every choice of both is
``fgd-reserve-servable``'s (the reserve acting included).
"""

from __future__ import annotations

import numpy as np

from gpupool.sim.policies import get_sim_policy
from gpupool.sim.policies.balance import PodRatioRanks, node_ranks
from gpupool.sim.policies.base import SimContext
from tests.sim.tiny import all_rows, context, node, pod, target

# a = 2 cards, 70 cores (35 cores per card); b = 8 cards, 96 cores (12 per card). Mix: A = (40 cores,
# 1 card) x 5, B = (10 cores, 1 card) x 5: demand 10,000 milli-GPU, 250,000 milli-CPU (25 cores per
# card). Free CPU 166 cores carries 6.64 cards < 10 free: CPU binds. Pod ranks: B 0.25, A 0.75. Node
# ranks (free-GPU shares by ascending free CPU per free GPU): b 4/10 = 0.4, a (8 + 1)/10 = 0.9.
MIX = target((40_000, 1000, 1, 5), (10_000, 1000, 1, 5))


def _ctx(cpu_a: int = 70_000, cpu_b: int = 96_000) -> SimContext:
    ctx = context([node("a", 2, cpu=cpu_a), node("b", 8, cpu=cpu_b)], MIX)
    ctx.population = MIX
    return ctx


def test_ranks_are_the_documented_shares() -> None:
    ctx = _ctx()
    assert node_ranks(ctx.frag.free_total, ctx.mirror.cpu_free).tolist() == [0.9, 0.4]
    ranks = PodRatioRanks(ctx)
    assert ranks.rank(pod(40_000, 1000, 1)) == 0.75
    assert ranks.rank(pod(10_000, 1000, 1)) == 0.25
    assert ranks.rank(pod(20_000, 0, 0)) == 1.0
    full = np.array([0, 3000])  # a node with no free GPU ranks 1
    assert node_ranks(full, np.array([50_000, 10_000])).tolist() == [1.0, 0.5]


def test_cpu_heavy_pods_go_to_cpu_rich_nodes_while_cpu_binds() -> None:
    # Usable-GPU loss (x demand x cpu_demand): heavy pod on a 2.5e8, on b 4e8; light pod on a 2.5e8,
    # on b 1e8; CPU-only pod on a 0, on b 2e8: the rank choice loses strictly less, so it stands.
    # fgd-reserve-servable (FGD's score, then the capacity gain) sends them the other way round.
    for name in ("fgd-reserve-balance", "fgd-balance"):
        balance = get_sim_policy(name)
        assert balance.choose(_ctx(), pod(40_000, 1000, 1), all_rows(_ctx()))[0] == 0
        assert balance.choose(_ctx(), pod(10_000, 1000, 1), all_rows(_ctx()))[0] == 1
        assert balance.choose(_ctx(), pod(20_000, 0, 0), all_rows(_ctx()))[0] == 0
    servable = get_sim_policy("fgd-reserve-servable")
    assert servable.choose(_ctx(), pod(40_000, 1000, 1), all_rows(_ctx()))[0] == 1
    assert servable.choose(_ctx(), pod(10_000, 1000, 1), all_rows(_ctx()))[0] == 0


def test_where_cpu_does_not_bind_it_is_the_servable_policy() -> None:
    # 400 + 400 cores carry 32 cards' worth of the mix > 10 free cards.
    for p in (pod(40_000, 1000, 1), pod(10_000, 1000, 1), pod(20_000, 0, 0)):
        for name in ("fgd-reserve-balance", "fgd-balance"):
            ctx_a, ctx_b = _ctx(400_000, 400_000), _ctx(400_000, 400_000)
            assert get_sim_policy(name).choose(ctx_a, p, all_rows(ctx_a)) == get_sim_policy(
                "fgd-reserve-servable"
            ).choose(ctx_b, p, all_rows(ctx_b))


# The reserve while CPU binds (fgd-balance). a = 8 free cards, b = 7 free cards (one used), 10 cores
# each. FGD's target: B only. Population: A = (8 cores, 8 cards) x 1, B = (4 cores, 1 card) x 8:
# demand 16,000 milli-GPU, 40,000 milli-CPU; 20 free cores carry 8,000 < 15,000 free milli-GPU: CPU
# binds. The pod asks 1 card and no CPU. FGD (target B) sees no change on either node: a tie, node
# order takes a; a GPU pod asking no CPU skips the capacity tie-break. The reserve: A's only slot is
# a (b has 7 cards); A dominates B, so D(A) = 8,000, D(B) = 16,000 capped to the empty cluster's 4
# B slots x 1,000 x 16,000 // horizon 8,000 = 8,000. Horizon after = min(14,000, 20,000 x 16,000 //
# 40,000 = 8,000). On a: A has no slot, short 8,000 x 8,000 = 64e6; on b: nothing short. So
# fgd-reserve-balance takes b; fgd-balance, without the reserve while CPU binds, takes FGD's a (the
# rank choice agrees: pod rank 0.25, node ranks a 4,000 / 15,000, b 11,500 / 15,000).
RESERVE_MIX = target((8000, 1000, 8, 1), (4000, 1000, 1, 8))


def _reserve_ctx(cpu: int = 10_000) -> SimContext:
    free = [[1000] * 8, [1000] * 7 + [0]]
    ctx = context([node("a", 8, cpu=cpu), node("b", 8, cpu=cpu)], target((4000, 1000, 1, 8)), gpu_free=free)
    ctx.population = RESERVE_MIX
    return ctx


def test_the_reserve_steps_aside_while_cpu_binds() -> None:
    p = pod(0, 1000, 1)
    assert get_sim_policy("fgd").choose(_reserve_ctx(), p, all_rows(_reserve_ctx()))[0] == 0
    assert get_sim_policy("fgd-reserve-balance").choose(_reserve_ctx(), p, all_rows(_reserve_ctx()))[0] == 1
    assert get_sim_policy("fgd-balance").choose(_reserve_ctx(), p, all_rows(_reserve_ctx()))[0] == 0


def test_the_reserve_still_acts_where_cpu_does_not_bind() -> None:
    # 2 x 100 cores carry 80,000 milli-GPU > 15,000: the reserve keeps a's 8 cards for A in both.
    p = pod(0, 1000, 1)
    for name in ("fgd-reserve-servable", "fgd-reserve-balance", "fgd-balance"):
        assert get_sim_policy(name).choose(_reserve_ctx(100_000), p, all_rows(_reserve_ctx(100_000)))[0] == 1
