"""The opt-in ``frag-gradient`` core policy: hand-worked choices, its learned mix, and properties
(it only ranks what the allocator found feasible, never over-commits, and is deterministic)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import Allocator, InvalidInput, ManualClock, OutcomeCode, SliceKind
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.policies import POLICIES, FragGradient, get_policy
from gpupool.core.policies.fraggradient import ShapeMix
from gpupool.hardware.slices import Slice
from tests.builders import GIB, a_request, a_slice


def _alloc(*slices: Slice, policy: FragGradient | str) -> Allocator:
    return Allocator(slices, clock=ManualClock(0.0), policy=policy, lease_ids=seeded_lease_ids(1))


def test_registered_by_name_but_not_the_default() -> None:
    assert isinstance(get_policy("frag-gradient"), FragGradient)
    assert "frag-gradient" in POLICIES


def test_keeps_the_slice_the_mix_needs_where_best_fit_would_break_it() -> None:
    # A has 600 mGPU free, B 500. The mix is mostly 500-mGPU requests. A 100-mGPU request:
    # best fit takes B (400 left: no 500 fits any more); FGD takes A (500 left: the mix still fits).
    #   B: fragment 0 -> 400 x 21 (the 500 shape's weight) = 8,400; -8,400 / 23 / 1000 GPU -> score 40
    #   A: fragment 0 -> 0 -> score 50; A wins.
    choices = {}
    for name in ("bestfit", "frag-gradient"):
        policy: FragGradient | str = name
        if name == "frag-gradient":
            fg = FragGradient()
            for i in range(20):
                fg.observe(a_request(f"h{i}", vram_gib=1, compute=500))
            policy = fg
        alloc = _alloc(a_slice("A", gpu="gA"), a_slice("B", gpu="gB"), policy=policy)
        assert alloc.place(a_request("fillA", vram_gib=1, compute=400), ("A",)).granted
        assert alloc.place(a_request("fillB", vram_gib=1, compute=500), ("B",)).granted
        out = alloc.allocate(a_request("r", vram_gib=1, compute=100))
        assert out.lease is not None
        choices[name] = out.lease.slice_ids
    assert choices == {"bestfit": ("B",), "frag-gradient": ("A",)}
    assert fg.mix.weights[(GIB, 500, 1)] == 21 and fg.mix.total == 23


def test_score_is_fgd_sigmoid_and_neutral_without_a_mix() -> None:
    fg = FragGradient()
    cap = a_slice("A").capacity
    assert fg.score(cap, cap, cap) == 50  # nothing observed: every slice scores the same
    fg.observe(a_request("x", vram_gib=1, compute=500))
    free = type(cap)(cap.vram_mib, 500)
    demand = type(cap)(GIB, 100)
    # 500 free fits the only shape (fragment 0); 400 left does not: fragment 400 x 1;
    # -400 / 1 / 1000 GPU -> floor(100 x sigmoid(-0.4)) = 40.
    assert fg.score(cap, free, demand) == 40


def test_mix_halves_past_its_window_and_evicts_the_lightest_shape() -> None:
    mix = ShapeMix(window=4, max_shapes=2)
    for shape in [(1, 1, 1)] * 3 + [(2, 2, 1)] * 2:
        mix.add(shape)
    # 5 > 4 after the fifth: {a: 3, b: 2} -> {a: 1, b: 1}
    assert mix.weights == {(1, 1, 1): 1, (2, 2, 1): 1} and mix.total == 2
    mix.add((3, 3, 1))  # full: the lightest goes, ties to the largest shape
    assert mix.weights == {(1, 1, 1): 1, (3, 3, 1): 1} and mix.total == 2
    with pytest.raises(ValueError):
        ShapeMix(window=0)


def test_bad_placement_input_leaves_the_mix_unchanged() -> None:
    fg = FragGradient()
    alloc = _alloc(a_slice("A", gpu="gA", node="n0"), a_slice("B", gpu="gB", node="n1"), policy=fg)
    with pytest.raises(InvalidInput):
        alloc.place(a_request("r", compute=1000, gpu_count=2, kinds=(SliceKind.WHOLE,)), ("A", "B"))
    assert fg.mix.total == 0 and fg.mix.version == 0


def _pool() -> list[Slice]:
    out = []
    for n in range(2):
        for g in range(3):
            gpu = f"n{n}/g{g}"
            if g == 0:
                out.append(
                    a_slice(f"{gpu}/mig", vram_gib=40, compute=428, kind=SliceKind.MIG, node=f"n{n}", gpu=gpu)
                )
                out.append(
                    a_slice(
                        f"{gpu}/mig1", vram_gib=10, compute=142, kind=SliceKind.MIG, node=f"n{n}", gpu=gpu
                    )
                )
            elif g == 1:
                out += [
                    a_slice(
                        f"{gpu}/mps{i}", vram_gib=12, compute=250, kind=SliceKind.MPS, node=f"n{n}", gpu=gpu
                    )
                    for i in range(2)
                ]
            else:
                out.append(a_slice(gpu, vram_gib=80, node=f"n{n}", gpu=gpu))
    return out


OPS = st.lists(
    st.tuples(
        st.booleans(),  # release a random active lease first
        st.integers(1, 45),  # vram GiB
        st.sampled_from([0, 100, 142, 250, 300, 428, 500, 1000]),
        st.sampled_from([1, 1, 1, 2]),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=40,
)


def _drive(ops: list[tuple[bool, int, int, int, int]]) -> list[tuple[str, tuple[str, ...]]]:
    """Run ``ops`` on a fresh ``frag-gradient`` pool; check every grant against the feasible set."""
    alloc = _alloc(*_pool(), policy="frag-gradient")
    trail: list[tuple[str, tuple[str, ...]]] = []
    for i, (release, vram, compute, count, pick) in enumerate(ops):
        active = sorted(lease.id for lease in alloc.leases if not lease.state.ended)
        if release and active:
            alloc.release(active[pick % len(active)])
        kinds = (SliceKind.WHOLE,) if count > 1 else ()
        req = a_request(
            f"r{i}", vram_gib=vram, compute=compute if count == 1 else 1000, gpu_count=count, kinds=kinds
        )
        feasible = {
            st.slice.id
            for st in alloc.states()
            if st.healthy and req.accepts(st.slice.kind) and req.demand.fits_in(st.free)
        }
        out = alloc.allocate(req, preempt=False)
        if count == 1:
            assert out.granted == bool(feasible), (req, feasible, out)
            if out.lease is not None:
                assert set(out.lease.slice_ids) <= feasible
        trail.append((out.code.value, out.lease.slice_ids if out.lease else ()))
        alloc.check_invariants()
    return trail


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_grants_exactly_when_a_slice_fits_never_overcommits_and_is_deterministic(
    ops: list[tuple[bool, int, int, int, int]],
) -> None:
    first = _drive(ops)
    assert _drive(ops) == first
    assert all(code != OutcomeCode.PREEMPTED_VICTIMS.value for code, _ in first)
