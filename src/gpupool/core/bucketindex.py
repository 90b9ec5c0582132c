"""`BucketIndex`: slices indexed by two integers (compute, VRAM) for fit queries in both dimensions.

Role: the ledger keeps one per slice shape for free capacity and one for reclaimable capacity.
Keys are bucketed by the compute value (few distinct values in practice: grants come in coarse
steps) and sorted by ``(vram, slice_id)`` inside a bucket; the sorted list of non-empty bucket
values sits beside them.

Invariants: ``_values`` lists exactly the keys of ``_buckets`` in ascending order; no bucket is
empty; a slice id appears at most once.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpupool.core.sortedkeys import SortedKeys

Key = tuple[int, int, str]
"""(vram, compute, slice_id)"""


class BucketIndex:
    __slots__ = ("_buckets", "_values")

    def __init__(self) -> None:
        self._buckets: dict[int, SortedKeys[tuple[int, str]]] = {}
        self._values: SortedKeys[int] = SortedKeys(load=64)

    def add(self, key: Key) -> None:
        vram, compute, sid = key
        bucket = self._buckets.get(compute)
        if bucket is None:
            bucket = self._buckets[compute] = SortedKeys()
            self._values.add(compute)
        bucket.add((vram, sid))

    def remove(self, key: Key) -> None:
        vram, compute, sid = key
        bucket = self._buckets[compute]
        bucket.remove((vram, sid))
        if not len(bucket):
            del self._buckets[compute]
            self._values.remove(compute)

    def __contains__(self, key: Key) -> bool:
        bucket = self._buckets.get(key[1])
        return bucket is not None and (key[0], key[2]) in bucket

    def fitting(self, vram: int, compute: int) -> Iterator[Key]:
        """Every key with both values >= the need: buckets ascending, VRAM ascending inside."""
        buckets = self._buckets
        for c in self._values.iter_from(compute):
            for v, sid in buckets[c].iter_from((vram, "")):
                yield (v, c, sid)

    def tightest_per_bucket(self, vram: int, compute: int) -> Iterator[Key]:
        """Per bucket >= ``compute`` (ascending), its least-VRAM key with VRAM >= ``vram``."""
        buckets = self._buckets
        for c in self._values.iter_from(compute):
            first = buckets[c].first_from((vram, ""))
            if first is not None:
                yield (first[0], c, first[1])

    def largest_vram(self) -> Key | None:
        best: Key | None = None
        for c, bucket in self._buckets.items():
            last = bucket.last()
            if last is not None and (best is None or (last[0], c) > (best[0], best[1])):
                best = (last[0], c, last[1])
        return best

    def bucket_values(self) -> list[int]:
        return list(self._values)

    def bucket_keys(self) -> list[int]:
        return sorted(self._buckets)
