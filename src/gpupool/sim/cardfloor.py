"""A second floor under the unallocated GPU: the cards that GPU-sharing pods must waste.

Role: `gpupool.sim.bound`'s relaxation pools the cluster and lets pods split, so where CPU does not
bind it says only "the arrivals fit" (a floor of about 0 %). Yet a card holding an 810-milli pod
keeps a 190-milli hole that only a pod of at most 190 milli can use: sharing pods strand GPU
inside the cards they use, whatever the policy. This module bounds that waste for one arrived set
and turns it into a floor on the unallocated GPU, valid for any packing, online or offline.

The argument (all quantities in milli-GPU; C = capacity, G = C / 1000 cards, W = the whole-card
GPU request of the set, S = the sharing pods, R = W + sum(S) <= C):
- A packing places a subset P of the sharing pods and whole-card requests of at most W. Its cards:
  ``placed whole / 1000 + bins(P) <= G``, where ``bins(P)`` is the least number of cards that can
  hold P (bin packing; node boundaries, CPU, memory and model pins are dropped, which only loosens
  the floor).
- So ``unallocated = C - placed whole - sum(P) >= max(C - W - sum(P), 1000 bins(P) - sum(P))``.
- A dual feasible function ``f`` (values summing to at most 1 over any set of sizes that fits one
  card) gives ``bins(P) >= sum of f(s / 1000) over P`` (Fekete and Schepers 2001). Then
  ``1000 bins(P) - sum(P) >= W0 - sum over the pods left out of (1000 f(s) - s)`` where ``W0`` is
  the same sum over all of S: leaving pods out lowers the waste term and raises the first term
  by their size.
- The packer's best choice of pods to leave out is bounded by a fractional knapsack: leave out
  first the pods whose waste saved per milli left out, ``(1000 f(s) - s) / s``, is largest, and
  stop where the two terms meet. The fractional optimum is at most the integral one, so the
  result is a floor.
- The floor is the largest value over a family of dual feasible functions: Fekete and Schepers'
  ``u_k`` (``x`` if ``(k + 1) x`` is an integer, else ``floor((k + 1) x) / k``), for k = 1..12;
  the threshold function ``U_e`` (1 above ``1 - e``, 0 below ``e``, ``x`` between) for every pod
  size ``e <= 1/2`` of the set; and each ``u_k`` after each ``U_e`` (a composition of dual feasible
  functions is one).

Exact rational arithmetic (`fractions.Fraction`), pods grouped by size, no constants tuned to any
workload. Where CPU binds the CPU relaxation is the larger floor; `gpupool.sim.bound` takes the
larger of the two. Tests: hand-worked cases and a brute-force check on small random sets.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Mapping
from fractions import Fraction

from gpupool.sim.trace import MILLI_PER_GPU as MILLI

MAX_K = 12
"""The largest k of the ``u_k`` family tried: more terms only cost time (every member is valid)."""

Dff = Callable[[Fraction], Fraction]


def fekete_schepers(k: int) -> Dff:
    """``u_k``: x where (k + 1) x is an integer, else floor((k + 1) x) / k (x in [0, 1])."""

    def u(x: Fraction) -> Fraction:
        y = (k + 1) * x
        return x if y.denominator == 1 else Fraction(y.numerator // y.denominator, k)

    return u


def threshold(e: Fraction) -> Dff:
    """``U_e`` for 0 <= e <= 1/2: 1 above 1 - e, x in [e, 1 - e], 0 below e."""

    def u(x: Fraction) -> Fraction:
        if x > 1 - e:
            return Fraction(1)
        return x if x >= e else Fraction(0)

    return u


def dual_feasible_functions(sizes_milli: list[int]) -> list[Dff]:
    """The family the floor maximises over (module docstring), for the sizes of one set."""
    fks = [fekete_schepers(k) for k in range(1, MAX_K + 1)]
    ths = [threshold(Fraction(s, MILLI)) for s in sorted(set(sizes_milli)) if 2 * s <= MILLI]
    return [*fks, *ths, *(_compose(f, t) for f in fks for t in ths)]


def _compose(outer: Dff, inner: Dff) -> Dff:
    return lambda x: outer(inner(x))


def _floor_one(counts: Mapping[int, int], slack_milli: int, dff: Dff) -> Fraction:
    """min over the pods left out of max(slack + left out, waste) for one dual feasible function."""
    waste = Fraction(0)
    savers: list[tuple[int, Fraction, int]] = []  # (size, waste saved per pod left out, pods)
    for size, n in counts.items():
        gain = MILLI * dff(Fraction(size, MILLI)) - size
        waste += gain * n
        if gain > 0:
            savers.append((size, gain, n))
    savers.sort(key=lambda t: t[1] / t[0], reverse=True)
    left_out = Fraction(0)
    for size, gain, n in savers:
        if slack_milli + left_out >= waste:
            break
        t = (waste - slack_milli - left_out) / (size + gain)  # where the two terms meet
        if t <= n:
            return slack_milli + left_out + t * size
        left_out += n * size
        waste -= n * gain
    return max(slack_milli + left_out, waste)


def sharing_floor_milli(sharing_milli: list[int], *, capacity_milli: int, whole_milli: int) -> Fraction:
    """A floor on the unallocated GPU (milli) of any packing of a set whose GPU-sharing pods ask
    ``sharing_milli`` (each below one card) and whose other GPU pods ask ``whole_milli`` in whole
    cards, on ``capacity_milli`` of GPU (whole cards). Never below ``capacity - request``."""
    counts = Counter(sharing_milli)
    slack = capacity_milli - whole_milli - sum(sharing_milli)
    best = Fraction(slack)
    for dff in dual_feasible_functions(list(counts)):
        best = max(best, _floor_one(counts, slack, dff))
    return best


def pooled_bfd_unallocated_milli(sharing_milli: list[int], *, capacity_milli: int, whole_milli: int) -> int:
    """An offline packer's result on the pooled cluster, for comparison (not a floor): the sharing
    pods by best-fit decreasing (each into the fullest card it fits, else a new card), then the
    whole-card request into the cards left, in whole cards. Node boundaries, CPU, memory and model
    pins are dropped, as for the floor; a sharing pod that finds no card stays out."""
    free: list[int] = []  # free milli of the cards opened, ascending
    cards = capacity_milli // MILLI
    placed = 0
    for size in sorted(sharing_milli, reverse=True):
        i = bisect.bisect_left(free, size)
        if i < len(free):
            rest = free.pop(i) - size
        elif len(free) < cards:
            rest = MILLI - size
        else:
            continue
        bisect.insort(free, rest)
        placed += size
    placed += min(whole_milli // MILLI, cards - len(free)) * MILLI
    return capacity_milli - placed
