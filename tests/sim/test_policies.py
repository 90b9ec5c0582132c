"""Each policy's choice on tiny clusters, with its scores worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.errors import InvalidInput
from gpupool.sim.policies import SIM_POLICIES, get_sim_policy
from gpupool.sim.policies.base import SimContext
from gpupool.sim.policies.baselines import bestfit_scores
from gpupool.sim.reserve import WholeCardReserve
from gpupool.sim.trace import NodeSpec
from gpupool.sim.workload import TargetWorkload
from tests.sim.tiny import all_rows, context, node, pod, target

TW = target((1000, 500, 1, 2), (1000, 1000, 1, 1), (1000, 0, 0, 1))
# n0: 8 GPUs, 96 cores (empty); n1: 2 GPUs, 16 cores, GPU1 has 600 free
NODES = [node("n0", 8, cpu=96_000), node("n1", 2, cpu=16_000)]


def ctx_two():  # type: ignore[no-untyped-def]
    return context(NODES, TW, gpu_free=[[1000] * 8, [1000, 600]])


def test_registry_lists_every_required_policy() -> None:
    for name in (
        "random",
        "dotprod",
        "clustering",
        "packing",
        "bestfit",
        "fgd",
        "seed-bestfit",
        "frag-bestfit",
    ):
        assert name in SIM_POLICIES
    with pytest.raises(InvalidInput):
        get_sim_policy("nope")


def test_bestfit_scores_by_hand() -> None:
    ctx = ctx_two()
    # n0: 1 - ((96000-4000)/128000*0.5 + (8000-1000)/8000*0.5) = 1 - (0.359375 + 0.4375) -> 20
    # n1: 1 - ((16000-4000)/128000*0.5 + (1600-1000)/8000*0.5) = 1 - (0.046875 + 0.0375) -> 91
    assert bestfit_scores(ctx, pod(4000, 1000, 1), all_rows(ctx)).tolist() == [20.0, 91.0]
    assert get_sim_policy("bestfit").choose(ctx, pod(4000, 1000, 1), all_rows(ctx)) == (1, (0,))


def test_dotprod_by_hand() -> None:
    ctx = ctx_two()
    # n0: 1 - (0.75*0.03125 + 1*0.125)/2 = 0.92578 -> 92; n1: 1 - (0.125*0.03125 + 0.2*0.125)/2 -> 98
    node_row, gpus = get_sim_policy("dotprod").choose(ctx, pod(4000, 1000, 1), all_rows(ctx))
    assert (node_row, gpus) == (1, (0,))
    # a 300-milli share on n1 goes to the best-fit GPU (600 free, not the full card)
    assert get_sim_policy("dotprod").choose(ctx, pod(4000, 300, 1), all_rows(ctx)) == (1, (1,))


def test_packing_by_hand() -> None:
    ctx = ctx_two()
    # share of 300: n0 is idle -> max(33 - 8, 8) = 25; n1 uses its shared GPU (600 free):
    # 100 - (600*100//1000)//10 = 94 -> n1, GPU1
    assert get_sim_policy("packing").choose(ctx, pod(1000, 300, 1), all_rows(ctx)) == (1, (1,))
    # 2 whole GPUs: n1 has only 1 free card (infeasible, so only n0 is offered) -> n0 cards 0,1
    assert get_sim_policy("packing").choose(ctx, pod(1000, 1000, 2), np.array([0])) == (0, (0, 1))
    # whole GPU: n0 idle -> 25; n1 uses 1 free card on a used node -> max(50 - 1, 33) = 49 -> n1
    assert get_sim_policy("packing").choose(ctx, pod(1000, 1000, 1), all_rows(ctx)) == (1, (0,))


def test_clustering_bands_by_hand() -> None:
    ctx = context([node("a", 8), node("b", 8), node("c", 8)], TW, gpu_free=[[1000] * 8] * 3)
    pol = get_sim_policy("clustering")
    # all empty: band 25 + 25*(8000-8000)//8000 = 25 everywhere -> first node
    first = pol.choose(ctx, pod(1000, 500, 1), all_rows(ctx))
    assert first == (0, (0,))
    ctx.mirror.apply(0, (0,), gpu_milli=500, cpu_milli=1000, memory_mib=0)
    ctx.frag.refresh(0)
    pol.placed(ctx, pod(1000, 500, 1), first)
    # a whole-GPU pod: a hosts only "sharing" (other type) -> 0 + 25*500//8000 = 1; b, c empty -> 25
    assert pol.choose(ctx, pod(1000, 1000, 1), all_rows(ctx))[0] == 1
    # another sharing pod: a hosts only this type -> 75 + 1 = 76 -> a, best-fit GPU0 (500 free)
    assert pol.choose(ctx, pod(1000, 200, 1), all_rows(ctx)) == (0, (0,))


def test_seed_bestfit_least_free_left_on_the_gpu() -> None:
    ctx = context(NODES, TW, gpu_free=[[1000, 1000, 350] + [1000] * 5, [1000, 600]])
    # a 300 share: leftovers n0/GPU2 = 50, n1/GPU1 = 300 -> n0 GPU2 (CPU ignored, as the seed did)
    assert get_sim_policy("seed-bestfit").choose(ctx, pod(1000, 300, 1), all_rows(ctx)) == (0, (2,))
    # 2 whole GPUs: fewest free whole cards -> n1 has 1 (infeasible); n0 has 7 -> n0 cards 0,1
    assert get_sim_policy("seed-bestfit").choose(ctx, pod(1000, 1000, 2), np.array([0])) == (0, (0, 1))


def test_random_is_seeded_and_uniform_over_fitting_gpus() -> None:
    picks = set()
    for seed in range(30):
        ctx = context(NODES, TW, gpu_free=[[1000] * 8, [1000, 600]], seed=seed)
        picks.add(get_sim_policy("random").choose(ctx, pod(1000, 700, 1), all_rows(ctx)))
    assert {p[0] for p in picks} == {0, 1}
    assert all(p[1][0] in (0, 1) if p[0] == 1 else True for p in picks)
    assert (1, (1,)) not in picks  # 600 free < 700 never fits
    a = context(NODES, TW, seed=7)
    b = context(NODES, TW, seed=7)
    pa = get_sim_policy("random").choose(a, pod(1000, 300, 1), all_rows(a))
    assert pa == get_sim_policy("random").choose(b, pod(1000, 300, 1), all_rows(b))


def test_fgd_prefers_the_gpu_that_lowers_fragmentation() -> None:
    # n0 free [1000, 500]: a 500 share on GPU1 leaves [1000, 0]: A fits (0 frag), B fits (0), C 1000
    # -> 1000, before 2*0 + 500 + 1500 = 2000, delta +0.25 GPU -> 56; on GPU0 -> [500, 500]: A 0,
    # B 1000, C 1000 -> 2000, delta 0 -> 50. n1 empty 2 GPUs: [500, 1000] -> 2000 vs 2000 -> 50.
    ctx = context([node("n0", 2), node("n1", 2)], TW, gpu_free=[[1000, 500], [1000, 1000]])
    assert get_sim_policy("fgd").choose(ctx, pod(1000, 500, 1), all_rows(ctx)) == (0, (1,))


def test_frag_bestfit_breaks_equal_gain_by_least_gpu_left() -> None:
    # both nodes empty 2-GPU nodes except n1 has one card taken: a whole-GPU pod has the same
    # fragmentation gain on n0 ([0,1000]: A0 B0 C1000 = 1000 from 2000) and on n1 ([0, 0] from
    # [1000, 0]: before 1000, after 0) -> gains 1000 and 1000; best fit (less GPU left) -> n1
    ctx = context([node("n0", 2), node("n1", 2)], TW, gpu_free=[[1000, 1000], [1000, 0]])
    assert get_sim_policy("frag-bestfit").choose(ctx, pod(1000, 1000, 1), all_rows(ctx)) == (1, (0,))


def test_fgd_capacity_breaks_fgd_ties_by_capacity_gain() -> None:
    tw = target((1000, 470, 1, 1), (3000, 1000, 1, 1))
    # b (row 0): 96 cores; a (row 1): 4 cores. A 1-core whole-card pod leaves FGD's measure at 0 on
    # both (one pod of each shape still fits) -> both score 50 -> FGD takes row 0.
    # Capacity measure: a goes 1120 -> 60 (gain 1060, see test_frag), b goes 120 -> 60 (gain 60) -> a.
    ctx = context([node("b", 2, cpu=96_000), node("a", 2, cpu=4000)], tw, gpu_free=[[1000, 1000]] * 2)
    assert get_sim_policy("fgd").choose(ctx, pod(1000, 1000, 1), all_rows(ctx)) == (0, (0,))
    assert get_sim_policy("fgd-capacity").choose(ctx, pod(1000, 1000, 1), all_rows(ctx)) == (1, (0,))


# fgd-reserve: a = 4 free cards, 64 cores; b = [1000, 1000, 190, 0], 64 cores. FGD's target is only
# A = (1 core, one whole card) x 10; the full shape distribution adds B = (8 cores, 4 whole cards) x 1,
# C = (12 cores, 500 milli) x 5 and E = (16 cores, one whole card) x 6. The pod: 4 cores, one card.
RESERVE_NODES = [node("a", 4, cpu=64_000), node("b", 4, cpu=64_000)]
RESERVE_FREE = [[1000] * 4, [1000, 1000, 190, 0]]
RESERVE_POP = target((1000, 1000, 1, 10), (8000, 1000, 4, 1), (12000, 500, 1, 5), (16000, 1000, 1, 6))


def with_population(
    nodes: list[NodeSpec], gpu_free: list[list[int]], population: TargetWorkload
) -> SimContext:
    """FGD's target is A = (1 core, one card) only; the reserve and capacity see ``population``."""
    ctx = context(nodes, target((1000, 1000, 1, 10)), gpu_free=gpu_free)
    ctx.population = population
    return ctx


def reserve_context() -> SimContext:
    return with_population(RESERVE_NODES, RESERVE_FREE, RESERVE_POP)


def test_fgd_reserve_keeps_the_whole_cards_that_expected_multi_gpu_demand_needs() -> None:
    # FGD: A fits before and after on both nodes (b's 190 stays a fragment) -> both 50 -> row 0 (a).
    # Capacity numerators (22 = total count; usable = min(gpu, cpu slots) x milli):
    #   a: 22*4000 - (10*4000 + 1*4000 + 5*2500 + 6*4000) = 7500 -> after: 22*3000 - (30000 + 0 + 12500
    #      + 18000) = 5500: gain 2000 (C's CPU-limited slots stop stranding 1000 milli);
    #   b: 22*2190 - (20000 + 0 + 10000 + 12000) = 6180 -> 22*1190 - (10000 + 0 + 5000 + 6000) = 5180:
    #      gain 1000. So fgd-capacity also takes a, breaking the only node that can host B.
    # Reserve (demand = 10000 + 4000 + 2500 + 6000 = 22500 milli; free after = 5190). Whole-card
    # groups (k, cpu): A (1, 1 core), B (4, 8 cores), E (1, 16 cores). Dominated demand: A's slots also
    # serve B and E -> 20000; B -> 4000 (E has one card); E -> 6000 (B asks only 8 cores).
    # B's expected share 4000/22500 x 5190 = 922.7 milli: on a no node keeps 4 free cards (shortfall
    # 922.7), on b node a keeps them with 64 cores (0). A: 20000/22500 x 5190 = 4613.3 <= 5 cards either
    # way; E: 1384 <= 5 slots (on a: min(3, 60/16) + min(2, 64/16); on b: 4 + min(1, 60/16)).
    ctx = reserve_context()
    p = pod(4000, 1000, 1)
    assert get_sim_policy("fgd").choose(ctx, p, all_rows(ctx)) == (0, (0,))
    assert get_sim_policy("fgd-capacity").choose(ctx, p, all_rows(ctx)) == (0, (0,))
    assert get_sim_policy("fgd-reserve").choose(ctx, p, all_rows(ctx)) == (1, (0,))
    reserve = WholeCardReserve(RESERVE_POP, ctx.mirror)
    assert reserve.dominated_demand.tolist() == [20000, 4000, 6000]
    short = reserve.shortfall_after(np.array([0, 1]), np.array([1, 1]), 1000, 4000)
    assert short.tolist() == [4000 * 5190, 0]  # scaled by the demand, 22500: 922.7 milli and 0


# A CPU-aware slot: a = 4 free cards, 64 cores; b = 4 free cards, 16 cores. Population: A = (1 core,
# one card) x 10, B = (32 cores, 4 cards) x 1. Both nodes have 4 free cards, but only a has the CPU
# for B (min(4/4, 64/32) = 1 slot; b: min(1, 16/32) = 0). demand = 14000; D(A) = 14000, D(B) = 4000.
CPU_NODES = [node("a", 4, cpu=64_000), node("b", 4, cpu=16_000)]
CPU_POP = target((1000, 1000, 1, 10), (32000, 1000, 4, 1))


def test_fgd_reserve_counts_a_multi_gpu_slot_only_where_its_cpu_fits() -> None:
    # One card, 1 core; free after = 7000. On a: B's only slot goes (a keeps 3 cards): shortfall
    # 4000/14000 x 7000 = 2000 milli; A keeps 3 + 4 = 7 slots >= 14000/14000 x 7000 / 1000. On b: 0.
    # A CPU-blind count would see b's 4 free cards as a B slot and score both placements 0.
    ctx = with_population(CPU_NODES, [[1000] * 4] * 2, CPU_POP)
    p = pod(1000, 1000, 1)
    assert get_sim_policy("fgd").choose(ctx, p, all_rows(ctx)) == (0, (0,))
    assert get_sim_policy("fgd-reserve").choose(ctx, p, all_rows(ctx)) == (1, (0,))
    reserve = WholeCardReserve(CPU_POP, ctx.mirror)
    assert reserve.supply.tolist() == [8, 1]
    short = reserve.shortfall_after(np.array([0, 1]), np.array([1, 1]), 1000, 1000)
    assert short.tolist() == [4000 * 7000, 0]
    # A CPU-only pod with 40 cores breaks B's slot on a too (24 cores left), and GPU demand is unchanged.
    assert reserve.shortfall_after(np.array([0]), np.array([0]), 0, 40_000).tolist() == [4000 * 8000]


def test_fgd_reserve_puts_the_reserve_before_fgds_score() -> None:
    # a = 4 free cards, 64 cores (the only slot for B = 4 cards + 32 cores); b = 2 free cards, 1 core.
    # One card, 1 core. FGD (target A only): on a, A still fits (score 50); on b, the last card is
    # left behind 0 cores (a 1000-milli fragment: score < 50) -> FGD takes a.
    # Reserve (demand 14000, free after 5000): on a, B loses its only slot (4000 x 5000) and A has
    # 3 + min(2, 1) = 4 slots for 14000/14000 x 5000 milli (14000 x 5000 - 4 x 1000 x 14000 = 14e6):
    # 34e6; on b, B keeps a's slot and A has 4 + min(1, 0) = 4 slots: 14e6 -> the reserve takes b.
    ctx = with_population(
        [node("a", 4, cpu=64_000), node("b", 2, cpu=1000)], [[1000] * 4, [1000] * 2], CPU_POP
    )
    p = pod(1000, 1000, 1)
    assert get_sim_policy("fgd").choose(ctx, p, all_rows(ctx)) == (0, (0,))
    reserve = WholeCardReserve(CPU_POP, ctx.mirror)
    assert reserve.shortfall_after(np.array([0, 1]), np.array([1, 1]), 1000, 1000).tolist() == [34e6, 14e6]
    assert get_sim_policy("fgd-reserve").choose(ctx, p, all_rows(ctx)) == (1, (0,))


def test_whole_card_reserve_refresh_matches_a_rebuild() -> None:
    ctx = reserve_context()
    reserve = WholeCardReserve(RESERVE_POP, ctx.mirror)
    ctx.mirror.apply(0, (1, 2), gpu_milli=1000, cpu_milli=1000, memory_mib=0)
    reserve.refresh(0)
    fresh = WholeCardReserve(RESERVE_POP, ctx.mirror)
    # a: 2 full cards, 63 cores; b: 2 full, 64 cores. Groups A (1 card), B (4 cards), E (1 card, 16 cores)
    assert reserve.supply.tolist() == fresh.supply.tolist() == [4, 0, 4]
    assert reserve.free_milli == fresh.free_milli == 4190
    rows, taken = np.array([0, 1]), np.array([1, 0])
    assert (
        reserve.shortfall_after(rows, taken, 500, 2000).tolist()
        == fresh.shortfall_after(rows, taken, 500, 2000).tolist()
    )
