"""SortedKeys and BucketIndex against a plain sorted-list model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.bucketindex import BucketIndex
from gpupool.core.sortedkeys import SortedKeys

ops = st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 6)), max_size=400)


@settings(max_examples=200, deadline=None)
@given(ops=ops, probe=st.integers(0, 61))
def test_sortedkeys_matches_a_sorted_list(ops: list[tuple[bool, int, int]], probe: int) -> None:
    idx: SortedKeys[tuple[int, int]] = SortedKeys(load=4)
    model: list[tuple[int, int]] = []
    for add, a, b in ops:
        key = (a, b)
        if add:
            idx.add(key)
            model.append(key)
            model.sort()
        elif key in model:
            idx.remove(key)
            model.remove(key)
        assert len(idx) == len(model)
    assert list(idx) == model
    assert list(idx.iter_from((probe, -1))) == [k for k in model if k >= (probe, -1)]
    for at in ((probe, -1), (probe, 3), (probe, 7)):  # between keys, on one, past a run of them
        assert idx.first_from(at) == next((k for k in model if k >= at), None)
    assert idx.last() == (model[-1] if model else None)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.sets(st.tuples(st.integers(0, 50), st.integers(0, 8), st.sampled_from("abcdefgh")), max_size=60),
    need_v=st.integers(0, 51),
    need_c=st.integers(0, 9),
)
def test_bucketindex_fitting_and_tightest(keys: set[tuple[int, int, str]], need_v: int, need_c: int) -> None:
    # keep one key per slice id, like the ledger does
    by_sid: dict[str, tuple[int, int, str]] = {}
    for k in sorted(keys):
        by_sid[k[2]] = k
    idx = BucketIndex()
    for k in by_sid.values():
        idx.add(k)
    fits = [k for k in by_sid.values() if k[0] >= need_v and k[1] >= need_c]
    assert sorted(idx.fitting(need_v, need_c)) == sorted(fits)
    tight = list(idx.tightest_per_bucket(need_v, need_c))
    for c in sorted({k[1] for k in fits}):
        want = min((k[0], k[2]) for k in fits if k[1] == c)
        assert (want[0], c, want[1]) in tight
    assert len(tight) == len({k[1] for k in fits})
    for k in list(by_sid.values())[::2]:
        idx.remove(k)
        assert k not in idx
