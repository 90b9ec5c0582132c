"""The core's ``frag-gradient`` computes FGD's score: where the simulator's measure has no CPU or
multi-GPU term to add (GPU pods asking no CPU, 1-GPU shapes), the core's per-slice score of every
placement equals the simulator's per-node FGD score, on random multi-GPU node states."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.policies import FragGradient
from gpupool.hardware.units import Resources
from gpupool.sim.engine import NOMINAL_VRAM_MIB, POD_VRAM_MIB
from gpupool.sim.policies.fgd import after, fgd_scores, placements
from tests.sim.tiny import context, node, pod, target

LEVELS = st.sampled_from([0, 50, 100, 250, 300, 500, 600, 750, 1000])


@settings(max_examples=80, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.sampled_from([50, 100, 250, 500, 1000]), st.integers(1, 30)), min_size=1, max_size=4
    ),
    free=st.lists(st.lists(LEVELS, min_size=1, max_size=4), min_size=1, max_size=4),
    share=st.sampled_from([50, 100, 250, 500, 1000]),
)
def test_core_score_equals_the_simulators_fgd_score(
    shapes: list[tuple[int, int]], free: list[list[int]], share: int
) -> None:
    merged: dict[int, int] = {}
    for milli, count in shapes:
        merged[milli] = merged.get(milli, 0) + count
    tw = target(*((0, milli, 1, count) for milli, count in merged.items()))
    nodes = [node(f"n{i}", len(row)) for i, row in enumerate(free)]
    ctx = context(nodes, tw, gpu_free=free)
    core = FragGradient()
    core.mix.weights = {(POD_VRAM_MIB, milli, 1): count for milli, count in merged.items()}
    core.mix.total = sum(merged.values())
    core.mix.version += 1
    p = pod(0, share, 1)
    feasible = np.flatnonzero((ctx.mirror.gpu_free >= share).any(axis=1))
    if not len(feasible):
        return
    rows, _, values = placements(ctx, p, feasible)
    sim = fgd_scores(ctx, rows, after(ctx.frag, p, rows, values))
    if share == 1000:  # a whole card: FGD takes a fully free card (`placements` reports value 0)
        values = np.full(len(rows), 1000)
    cap = Resources(NOMINAL_VRAM_MIB, 1000)
    for r, v, want in zip(rows.tolist(), values.tolist(), sim.tolist(), strict=True):
        slice_free = Resources(NOMINAL_VRAM_MIB, int(v))
        got = core.score(cap, slice_free, Resources(POD_VRAM_MIB, share))
        assert got == int(want), (r, v, got, want)
