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
  size ``e <= 1/2`` of the set (at most `MAX_THRESHOLDS` of them, spread evenly); and each ``u_k``
  after each ``U_e`` (a composition of dual feasible functions is one).

Exact arithmetic (integers scaled by `SCALE`, one `fractions.Fraction` per function), pods grouped
by size, no constants tuned to any workload; about 1.5 s for a set with 999 distinct sizes. Where
CPU binds the CPU relaxation is the larger floor; `gpupool.sim.bound` takes the larger of the two.
Tests: hand-worked cases and a brute-force check on small random sets.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Mapping
from fractions import Fraction

from gpupool.sim.trace import MILLI_PER_GPU as MILLI

MAX_K = 12
"""The largest k of the ``u_k`` family tried: more terms only cost time (every member is valid)."""
MAX_THRESHOLDS = 64
"""At most this many threshold functions, spread evenly over the set's distinct sizes up to half a
card (all of them when there are fewer): a cost cap for traces with hundreds of distinct sizes;
a smaller family only loosens the floor, it never makes it wrong."""
SCALE = 27_720
"""lcm(1..12): every ``u_k`` value is a multiple of 1 / (1000 x SCALE) of a card for sizes in milli,
so the functions return integers ``F`` with f(x) = F / (1000 x SCALE): exact, and fast."""
ONE = MILLI * SCALE

Dff = Callable[[int], int]
"""A dual feasible function on sizes in milli, scaled: ``f(size) = F / ONE`` of a card."""


def fekete_schepers(k: int) -> Dff:
    """``u_k``: x where (k + 1) x is an integer, else floor((k + 1) x) / k (x = size / 1000)."""

    def u(size: int) -> int:
        q, r = divmod((k + 1) * size, MILLI)
        return size * SCALE if r == 0 else q * (ONE // k)

    return u


def threshold(e_milli: int) -> Dff:
    """``U_e`` for 0 <= e <= 1/2: 1 above 1 - e, x in [e, 1 - e], 0 below e."""

    def u(size: int) -> int:
        if size > MILLI - e_milli:
            return ONE
        return size * SCALE if size >= e_milli else 0

    return u


def _compose(outer: Dff, e_milli: int) -> Dff:
    """``outer`` after ``U_e``: U_e's values are 0, x or 1, and every ``u_k`` keeps 0 and 1."""

    def u(size: int) -> int:
        if size > MILLI - e_milli:
            return ONE
        return outer(size) if size >= e_milli else 0

    return u


def dual_feasible_functions(sizes_milli: list[int]) -> list[Dff]:
    """The family the floor maximises over (module docstring), for the sizes of one set."""
    fks = [fekete_schepers(k) for k in range(1, MAX_K + 1)]
    small = sorted({s for s in sizes_milli if 2 * s <= MILLI})
    if len(small) > MAX_THRESHOLDS:
        small = sorted({small[i * (len(small) - 1) // (MAX_THRESHOLDS - 1)] for i in range(MAX_THRESHOLDS)})
    ths = [threshold(e) for e in small]
    return [*fks, *ths, *(_compose(f, e) for f in fks for e in small)]


def _floor_one(counts: Mapping[int, int], slack_milli: int, dff: Dff) -> Fraction:
    """min over the pods left out of max(slack + left out, waste) for one dual feasible function
    (integers scaled by SCALE; one division at the end)."""
    waste = 0
    savers: list[tuple[int, int, int]] = []  # (size, waste saved per pod left out, pods), scaled
    for size, n in counts.items():
        gain = dff(size) - size * SCALE
        waste += gain * n
        if gain > 0:
            savers.append((size * SCALE, gain, n))
    savers.sort(key=lambda t: Fraction(t[1], t[0]), reverse=True)
    slack, left_out = slack_milli * SCALE, 0
    for size, gain, n in savers:
        if slack + left_out >= waste:
            break
        t = Fraction(waste - slack - left_out, size + gain)  # where the two terms meet
        if t <= n:
            return (slack + left_out + t * size) / SCALE
        left_out += n * size
        waste -= n * gain
    return Fraction(max(slack + left_out, waste), SCALE)


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
