"""The sharing pods' card floor (`gpupool.sim.cardfloor`): hand-worked sets where the floor is the
optimum, a brute-force check that it never exceeds the best packing of small random sets, and
that every function of the family is dual feasible (sums to at most 1 over sizes that fit a card)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.sim.bound import offline_bound
from gpupool.sim.cardfloor import (
    MAX_K,
    MAX_THRESHOLDS,
    ONE,
    dual_feasible_functions,
    pooled_bfd_unallocated_milli,
    sharing_floor_milli,
)
from gpupool.sim.trace import NodeSpec, PodSpec

SIZES = st.sampled_from([30, 100, 190, 230, 250, 320, 333, 460, 470, 500, 510, 600, 650, 810, 990])


def _min_bins(sizes: list[int]) -> int:
    """Exact bin packing by search (a handful of items)."""
    best = len(sizes)

    def go(i: int, loads: list[int]) -> None:
        nonlocal best
        if len(loads) >= best:
            return
        if i == len(sizes):
            best = len(loads)
            return
        for b in range(len(loads)):
            if loads[b] + sizes[i] <= 1000:
                loads[b] += sizes[i]
                go(i + 1, loads)
                loads[b] -= sizes[i]
        go(i + 1, [*loads, sizes[i]])

    go(0, [])
    return best if sizes else 0


def _optimum_unallocated(sharing: list[int], whole_cards: int, cards: int) -> int:
    """The least unallocated milli over every subset of sharing pods, whole cards filling the rest."""
    best = cards * 1000
    for r in range(len(sharing) + 1):
        for subset in itertools.combinations(sharing, r):
            bins = _min_bins(sorted(subset, reverse=True))
            if bins > cards:
                continue
            placed = sum(subset) + 1000 * min(whole_cards, cards - bins)
            best = min(best, cards * 1000 - placed)
    return best


def test_holes_beside_810_milli_pods_are_the_floor() -> None:
    # 10 cards; five 810-milli pods and six whole cards ask 10,050: something must stay out. Leaving
    # a whole card out strands 5 x 190 (950); leaving one 810 out strands 4 x 190 + 0 and loses 810:
    # the optimum is 760, and so is the floor.
    assert _optimum_unallocated([810] * 5, 6, 10) == 760
    assert sharing_floor_milli([810] * 5, capacity_milli=10_000, whole_milli=6000) == 760


def test_three_pods_above_half_a_card_on_two_cards() -> None:
    # 3 x 600 on 2 cards: one stays out (800 unallocated); the floor finds exactly that.
    assert sharing_floor_milli([600] * 3, capacity_milli=2000, whole_milli=0) == 800


def test_pods_that_pair_exactly_strand_nothing() -> None:
    assert sharing_floor_milli([500] * 4 + [250] * 4, capacity_milli=3000, whole_milli=0) == 0
    assert sharing_floor_milli([], capacity_milli=3000, whole_milli=1000) == 2000  # the request's slack


@settings(max_examples=150, deadline=None)
@given(st.lists(SIZES, max_size=6), st.integers(0, 3), st.integers(1, 4))
def test_the_floor_never_exceeds_the_best_packing(sharing: list[int], whole: int, cards: int) -> None:
    floor = sharing_floor_milli(sharing, capacity_milli=1000 * cards, whole_milli=1000 * whole)
    assert floor <= _optimum_unallocated(sharing, whole, cards)


@settings(max_examples=200, deadline=None)
@given(st.lists(SIZES, min_size=1, max_size=8))
def test_every_function_is_dual_feasible(sizes: list[int]) -> None:
    fits = sizes[: max(i for i in range(len(sizes) + 1) if sum(sizes[:i]) <= 1000)]
    for f in dual_feasible_functions(sizes):
        assert sum(f(s) for s in fits) <= ONE


def test_offline_bound_takes_the_larger_floor() -> None:
    # 4 cards, 1,000 cores each node: CPU never binds. Ten 810-milli pods: four arrive by 100 %
    # (3,240 milli); each card keeps a 190 hole, so 760 milli (19 %) stay unallocated whatever the
    # placement, which the CPU relaxation alone (0 %) does not see.
    nodes = [
        NodeSpec(name=f"n{i}", cpu_milli=10**6, memory_mib=10**6, gpu_count=2, gpu_model="T4")
        for i in range(2)
    ]
    pods = [PodSpec(name=f"p{i}", cpu_milli=1000, memory_mib=0, num_gpu=1, gpu_milli=810) for i in range(10)]
    r = offline_bound(nodes, pods, seed=42)
    assert r.arrived_milli == 3240
    assert r.cpu_placeable_milli == 3240 and r.cards_placeable_milli == 3240 == r.placeable_milli
    assert r.unallocated_pct == 19.0


def test_pooled_best_fit_decreasing_is_an_offline_packing() -> None:
    # Sorted: 810 opens card 1, 650 card 2, 320 joins 650 (970), 190 joins 810 (1000), 30 joins
    # 970 (1000): two cards, nothing stranded; then 1 whole card of the 2 asked fits in 3 cards.
    assert pooled_bfd_unallocated_milli([190, 650, 30, 810, 320], capacity_milli=3000, whole_milli=2000) == 0
    # A pod that finds no card stays out: 3 x 600 on 2 cards leave 800.
    assert pooled_bfd_unallocated_milli([600] * 3, capacity_milli=2000, whole_milli=0) == 800


@settings(max_examples=100, deadline=None)
@given(st.lists(SIZES, max_size=6), st.integers(0, 3), st.integers(1, 4))
def test_pooled_bfd_is_never_below_the_floor(sharing: list[int], whole: int, cards: int) -> None:
    kw = {"capacity_milli": 1000 * cards, "whole_milli": 1000 * whole}
    packed = pooled_bfd_unallocated_milli(sharing, **kw)
    assert _optimum_unallocated(sharing, whole, cards) <= packed
    assert sharing_floor_milli(sharing, **kw) <= packed


def test_hundreds_of_distinct_sizes_stay_cheap_and_valid() -> None:
    # Every size from 1 to 999 milli three times on 2,000 cards: the family is capped
    # (MAX_THRESHOLDS), the floor stays a floor: here the request itself leaves the slack.
    sizes = list(range(1, 1000)) * 3
    assert len(dual_feasible_functions(sizes)) == MAX_K + MAX_THRESHOLDS * (MAX_K + 1)
    floor = sharing_floor_milli(sizes, capacity_milli=2_000_000, whole_milli=0)
    assert (
        2_000_000 - sum(sizes)
        <= floor
        <= pooled_bfd_unallocated_milli(sizes, capacity_milli=2_000_000, whole_milli=0)
    )
