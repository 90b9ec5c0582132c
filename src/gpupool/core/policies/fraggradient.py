"""``frag-gradient``: FGD's fragmentation gradient on the core's slices, over a learned demand mix.

Role: the GPU-only part of the simulator's default (`gpupool.sim.policies.balance`) that the core can
run with what it holds. Opt-in (``policy="frag-gradient"``); not the default (docs/fgd/README.md,
"The core policy": it scans every feasible slice, O(S) per allocate, and without node CPU it
places worse than FGD on the simulator).

The mix: `ShapeMix`, a bounded, decayed histogram of the demands the allocator was asked for, as
shapes ``(vram MiB, compute milli, gpu count)``, fed by `observe` (the allocator calls it once per
`allocate` / `place`, before scoring). Integer weights: +1 per request; when the total exceeds
`MIX_WINDOW_REQUESTS` every weight is halved (rounded down; zeros dropped), so requests older than
a few windows stop counting; at most `MIX_MAX_SHAPES` shapes, a new shape beyond that evicts the
lightest (ties: the largest shape). Deterministic: the mix is a function of the observed sequence.

Fragment of a slice for shape s (FGD's definition, per slice): the slice's free compute milli if s
cannot use it, else 0. A 1-GPU shape can use it when its VRAM and compute fit the free amounts; an
N-GPU shape only when the slice is entirely free and its capacity holds the shape (it takes whole
cards). For 1-GPU shapes this equals FGD's node measure summed over the node's GPUs (FGD's
node-level "fewer than k GPUs fit" clause only matters for k > 1); for N-GPU shapes it is a per-card
relaxation: the core's `Policy` sees one slice, not its node's other free cards. Slice kinds that
the shape's requests would not accept and node CPU (the core does not hold it) play no part, so
the simulator's CPU terms (the CPU-aware reserve and rank matching) have no core counterpart.

Cost: FGD's integer score ``int(100 x sigmoid(-delta / W / 1000))`` (delta = change of the slice's
weighted fragment, W = total weight; 100 = best), then the 2-D best fit (`BestFit2D`, 0..2000) of
the default policy as its tie-breaker: ``(100 - score) x 2001 + bestfit``. Not monotone: the
allocator scans every feasible slice. A memo keyed by (capacity, free, demand) is cleared whenever
the mix changes, so slices in the same state cost one evaluation per allocate.

Invariant: the policy only ranks the slices the allocator found feasible; it never widens the set.
"""

from __future__ import annotations

import math
from typing import ClassVar

from gpupool.core.ledger import SliceState
from gpupool.core.model import Request
from gpupool.core.policies.bestfit import BestFit2D
from gpupool.hardware.units import Resources

MIX_WINDOW_REQUESTS = 4096
"""Total weight above which every weight is halved: the mix remembers about this many requests."""
MIX_MAX_SHAPES = 64
"""Distinct shapes kept; the cost of one slice evaluation is O(shapes)."""
MAX_SCORE = 100
BESTFIT_SPAN = 2001
"""One more than the largest `BestFit2D` cost (two permilles): a tie-breaker never outweighs a score step."""

Shape = tuple[int, int, int]
"""(vram MiB, compute milli, gpu count) of one request."""


class ShapeMix:
    """Bounded, decayed integer histogram of request shapes (see the module docstring)."""

    def __init__(self, *, window: int = MIX_WINDOW_REQUESTS, max_shapes: int = MIX_MAX_SHAPES) -> None:
        if window < 1 or max_shapes < 1:
            raise ValueError("window and max_shapes must be >= 1")
        self.window = window
        self.max_shapes = max_shapes
        self.weights: dict[Shape, int] = {}
        self.total = 0
        self.version = 0
        """Bumped on every change, so memos of costs under the old mix can be dropped."""

    def add(self, shape: Shape) -> None:
        if shape not in self.weights and len(self.weights) >= self.max_shapes:
            victim = min(self.weights, key=lambda s: (self.weights[s], tuple(-x for x in s)))
            self.total -= self.weights.pop(victim)
        self.weights[shape] = self.weights.get(shape, 0) + 1
        self.total += 1
        if self.total > self.window:
            halved = {s: w // 2 for s, w in self.weights.items() if w // 2}
            self.weights = halved
            self.total = sum(halved.values())
        self.version += 1


def _usable(shape: Shape, capacity: Resources, free: Resources) -> bool:
    vram, compute, count = shape
    if count > 1:
        return free == capacity and vram <= capacity.vram_mib and compute <= capacity.compute_milli
    return vram <= free.vram_mib and compute <= free.compute_milli


class FragGradient:
    """See the module docstring."""

    name: ClassVar[str] = "frag-gradient"
    monotone: ClassVar[bool] = False

    def __init__(self) -> None:
        self.mix = ShapeMix()
        self._bestfit = BestFit2D()
        self._memo: dict[tuple[int, int, int, int, int, int], int] = {}
        self._memo_version = -1

    def observe(self, request: Request) -> None:
        """Count one request's shape into the mix (the allocator calls this once per request)."""
        d = request.demand
        self.mix.add((d.vram_mib, d.compute_milli, request.gpu_count))

    def fragment(self, capacity: Resources, free: Resources) -> int:
        """Weighted fragment of a slice: free compute milli x weight of the shapes that cannot use it."""
        blocked = sum(w for s, w in self.mix.weights.items() if not _usable(s, capacity, free))
        return free.compute_milli * blocked

    def score(self, capacity: Resources, free: Resources, demand: Resources) -> int:
        """FGD's integer score (0..100, higher = better) of taking ``demand`` from ``free``."""
        if not self.mix.total:
            return MAX_SCORE // 2
        left = Resources(free.vram_mib - demand.vram_mib, free.compute_milli - demand.compute_milli)
        delta = self.fragment(capacity, left) - self.fragment(capacity, free)
        gpus = -delta / self.mix.total / 1000.0
        return math.floor(MAX_SCORE / (1.0 + math.exp(-gpus)))

    def cost(self, state: SliceState, demand: Resources) -> int:
        if self._memo_version != self.mix.version:
            self._memo.clear()
            self._memo_version = self.mix.version
        cap, free = state.slice.capacity, state.free
        key = (
            cap.vram_mib,
            cap.compute_milli,
            free.vram_mib,
            free.compute_milli,
            demand.vram_mib,
            demand.compute_milli,
        )
        fgd = self._memo.get(key)
        if fgd is None:
            fgd = (MAX_SCORE - self.score(cap, free, demand)) * BESTFIT_SPAN
            self._memo[key] = fgd
        return fgd + self._bestfit.cost(state, demand)

    def cost_floor(self, capacity: Resources, vram_left_mib: int, compute_left_milli: int) -> int:
        return -(2**62)
