"""MIG validator and placement search against the fact sheet's tables (gpu-facts.md 1.3-1.4)."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.hardware.catalogue import GPU_MODELS
from gpupool.hardware.mig import (
    IllegalLayoutError,
    MigInstance,
    best_layout,
    find_placement,
    is_legal_layout,
    layout_problems,
    maximal_layouts,
    mig_profile,
    mig_profiles,
    validate_layout,
)

# The reference's 38 maximal mixes with one example placement each ("1g2" = double-memory 1g).
REFERENCE_MAXIMAL = """
7g@0
4g@0 3g@4
3g@0 3g@4
2g@0 2g@2 3g@4
2g@0 1g@2 1g@3 3g@4
1g@0 1g@1 1g@2 1g@3 3g@4
3g@0 2g@4 1g@6
3g@0 2g@4 1g2@6
3g@0 1g@4 1g@5 1g@6
3g@0 1g@4 1g@5 1g2@6
3g@0 1g2@4 1g2@6
3g@0 1g2@4 1g@6
4g@0 2g@4 1g@6
4g@0 2g@4 1g2@6
4g@0 1g@4 1g@5 1g@6
4g@0 1g@4 1g@5 1g2@6
4g@0 1g2@4 1g2@6
4g@0 1g2@4 1g@6
2g@0 2g@2 2g@4 1g@6
2g@0 2g@2 2g@4 1g2@6
2g@0 2g@2 1g@4 1g@5 1g@6
2g@0 2g@2 1g@4 1g@5 1g2@6
2g@0 2g@2 1g2@4 1g@6
2g@0 2g@2 1g2@4 1g2@6
2g@0 1g@2 1g@3 1g@4 1g@5 1g@6
2g@0 1g@2 1g@3 1g@4 1g@5 1g2@6
2g@0 1g2@2 1g@4 1g@5 1g@6
2g@0 1g2@2 1g@4 1g@5 1g2@6
2g@0 1g2@2 1g2@4 1g@6
2g@0 1g2@2 1g2@4 1g2@6
1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6
1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g2@6
1g2@0 1g@2 1g@3 1g@4 1g@5 1g@6
1g2@0 1g@2 1g@3 1g@4 1g@5 1g2@6
1g2@0 1g2@2 1g@4 1g@5 1g@6
1g2@0 1g2@2 1g@4 1g@5 1g2@6
1g2@0 1g2@2 1g2@4 1g@6
1g2@0 1g2@2 1g2@4 1g2@6
"""

EIGHT_SLOT = [
    "A100-SXM4-40GB",
    "A100-SXM4-80GB",
    "H100-SXM5-80GB",
    "H100-NVL-94GB",
    "H200-141GB",
    "H20-96GB",
    "B200-180GB",
]


def _names(model: str) -> dict[str, str]:
    return {p.shape: p.name for p in mig_profiles(model)}


def _layout(model: str, text: str) -> list[MigInstance]:
    names = _names(model)
    out = []
    for tok in text.split():
        shape, start = tok.split("@")
        out.append(MigInstance(names[shape], int(start)))
    return out


@pytest.mark.parametrize("model", EIGHT_SLOT)
def test_every_reference_maximal_layout_is_legal(model):
    for line in REFERENCE_MAXIMAL.strip().splitlines():
        layout = _layout(model, line)
        assert layout_problems(model, layout) == (), line


@pytest.mark.parametrize("model", EIGHT_SLOT)
def test_maximal_enumeration_matches_reference(model):
    layouts = maximal_layouts(model)
    assert len(layouts) == 78
    shape_of = {v: k for k, v in _names(model).items()}
    mixes = {tuple(sorted(Counter(shape_of[i.profile] for i in lay).items())) for lay in layouts}
    ref = set()
    for line in REFERENCE_MAXIMAL.strip().splitlines():
        ref.add(tuple(sorted(Counter(t.split("@")[0] for t in line.split()).items())))
    assert mixes == ref
    assert len(ref) == 38
    for lay in layouts:
        assert is_legal_layout(model, lay)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("4g@0 4g@4", "illegal start"),
        ("2g@0 2g@2 2g@4 2g@6", "illegal start"),
        ("3g@0 3g@4 1g@2", "overlap"),
        ("1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6 1g@7", "illegal start"),
        ("4g@0 2g@4 2g@6", "illegal start"),
        ("4g@0 2g@4 2g@4", "overlap"),
        ("7g@0 1g@0", "overlap"),
        ("3g@0 3g@0", "overlap"),
        ("1g2@1", "illegal start"),
        ("1g+me@0 1g+me@1", "too many instances"),
        ("1g2@0 1g2@2 1g2@4 1g2@6 1g2@6", "overlap"),
    ],
)
def test_known_illegal_layouts_rejected_with_reason(text, reason):
    problems = layout_problems("A100-SXM4-80GB", _layout("A100-SXM4-80GB", text))
    assert problems and problems[0].startswith(reason), problems
    with pytest.raises(IllegalLayoutError, match=reason):
        validate_layout("A100-SXM4-80GB", _layout("A100-SXM4-80GB", text))


def test_too_many_compute_slices_reported():
    # 1g at 0..6 (7 SM slices) + a 1g2 at 6 would overlap; check the SM budget message on a pure count case
    lay = [MigInstance("1g.10gb", i) for i in range(7)] + [MigInstance("1g.10gb", 6)]
    problems = layout_problems("A100-SXM4-80GB", lay)
    assert any(p.startswith("too many compute slices") for p in problems)


def test_profile_not_on_this_model():
    problems = layout_problems("A100-SXM4-80GB", [MigInstance("3g.20gb", 0)])
    assert problems[0].startswith("profile '3g.20gb' is not on A100-SXM4-80GB")
    with pytest.raises(IllegalLayoutError, match="is not on"):
        mig_profile("H100-SXM5-80GB", "3g.20gb")


def test_non_mig_model_rejected():
    assert "does not support MIG" in layout_problems("L40S-48GB", [MigInstance("1g.10gb", 0)])[0]


def test_a30_layouts():
    lays = maximal_layouts("A30-24GB")
    mixes = sorted(tuple(sorted(i.profile for i in lay)) for lay in lays)
    assert mixes == sorted(
        [
            ("4g.24gb",),
            ("2g.12gb", "2g.12gb"),
            ("1g.6gb", "1g.6gb", "2g.12gb"),
            ("1g.6gb", "1g.6gb", "2g.12gb"),
            ("1g.6gb", "1g.6gb", "1g.6gb", "1g.6gb"),
        ]
    )
    assert not is_legal_layout("A30-24GB", [MigInstance("2g.12gb", 1)])
    assert not is_legal_layout("A30-24GB", [MigInstance("1g.6gb", 4)])


def test_order_pitfall_largest_first():
    # nvidia-smi -cgi 19,19,14,9 fails when auto-placed; an explicit placement exists
    lay = find_placement("A100-SXM4-40GB", ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"])
    assert lay is not None and is_legal_layout("A100-SXM4-40GB", lay)
    assert MigInstance("3g.20gb", 4) in lay


def test_best_layout_fills_pool_with_largest_instance():
    lay = best_layout("A100-SXM4-80GB", ["3g.40gb", "1g.10gb", "1g.10gb"])
    assert lay is not None
    assert is_legal_layout("A100-SXM4-80GB", lay.all)
    assert [str(i) for i in lay.pool] == ["2g.20gb@2"]
    assert best_layout("A100-SXM4-80GB", ["4g.40gb", "4g.40gb"]) is None


def test_profile_memory_from_fact_sheet():
    assert mig_profile("A100-SXM4-80GB", "3g.40gb").memory_mib == 40192
    assert mig_profile("H100-SXM5-80GB", "1g.10gb").memory_mib == 9984
    assert mig_profile("H100-SXM5-80GB", "3g.40gb").sm_count == 60
    assert mig_profile("H100-PCIE-80GB", "3g.40gb").sm_count == 46
    assert mig_profile("B200-180GB", "1g.23gb").memory_mib == 20992
    assert mig_profile("A30-24GB", "2g.12gb").profile_id == 5
    assert mig_profile("A100-SXM4-40GB", "1g.10gb").profile_id == 15


MIG_MODELS = [m.name for m in GPU_MODELS if m.mig_capable]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(MIG_MODELS), st.data())
def test_placement_search_only_returns_legal_layouts(model, data):
    names = [p.name for p in mig_profiles(model)]
    wanted = data.draw(st.lists(st.sampled_from(names), max_size=8))
    lay = best_layout(model, wanted)
    first = find_placement(model, wanted)
    assert (lay is None) == (first is None)
    if lay is None:
        return
    assert sorted(i.profile for i in lay.instances) == sorted(wanted)
    assert is_legal_layout(model, lay.all), lay
    # the pool is maximal: no further standard instance fits beside it
    for extra in mig_profiles(model):
        if extra.media:
            continue
        for start in extra.starts:
            assert not is_legal_layout(model, [*lay.all, MigInstance(extra.name, start)])
