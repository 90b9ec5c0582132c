"""`SortedKeys`: a sorted multiset of comparable keys with O(log n) search and ~O(sqrt n) updates.

Role: the free-capacity index of the ledger. The core must stay standard-library only, so this is a
small bucketed list (the layout `sortedcontainers.SortedList` uses): a list of sorted sub-lists of at
most ``2 * load`` keys plus the list of their maxima. Search is two bisections; insert and delete
touch one sub-list of bounded size, so their cost does not grow with the pool the way a flat
``bisect.insort`` on one list does.

Invariants: every sub-list is non-empty and sorted; ``_maxes[i] == _lists[i][-1]``; sub-lists are in
order (``_maxes`` ascending). Keys must not be mutated while stored.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Any)

DEFAULT_LOAD = 256


class SortedKeys(Generic[K]):
    __slots__ = ("_len", "_lists", "_load", "_maxes")

    def __init__(self, load: int = DEFAULT_LOAD) -> None:
        self._lists: list[list[K]] = []
        self._maxes: list[K] = []
        self._load = load
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def add(self, key: K) -> None:
        lists, maxes = self._lists, self._maxes
        self._len += 1
        if not maxes:
            lists.append([key])
            maxes.append(key)
            return
        pos = bisect_left(maxes, key)
        if pos == len(maxes):
            pos -= 1
            lists[pos].append(key)
            maxes[pos] = key
        else:
            insort(lists[pos], key)
        if len(lists[pos]) > 2 * self._load:
            sub = lists[pos]
            half = sub[self._load :]
            del sub[self._load :]
            maxes[pos] = sub[-1]
            lists.insert(pos + 1, half)
            maxes.insert(pos + 1, half[-1])

    def remove(self, key: K) -> None:
        """Remove one occurrence of ``key``; `KeyError` when absent."""
        lists, maxes = self._lists, self._maxes
        pos = bisect_left(maxes, key)
        if pos == len(maxes):
            raise KeyError(key)
        sub = lists[pos]
        i = bisect_left(sub, key)
        if i == len(sub) or sub[i] != key:
            raise KeyError(key)
        del sub[i]
        self._len -= 1
        if sub:
            maxes[pos] = sub[-1]
        else:
            del lists[pos]
            del maxes[pos]

    def __contains__(self, key: K) -> bool:
        pos = bisect_left(self._maxes, key)
        if pos == len(self._maxes):
            return False
        sub = self._lists[pos]
        i = bisect_left(sub, key)
        return i < len(sub) and sub[i] == key

    def first_from(self, key: K) -> K | None:
        """The least key >= ``key``, or None (two bisections, no iterator)."""
        maxes = self._maxes
        pos = bisect_left(maxes, key)
        if pos == len(maxes):
            return None
        sub = self._lists[pos]
        return sub[bisect_left(sub, key)]  # (sub[-1] == maxes[pos] >= key: in range)

    def iter_from(self, key: K) -> Iterator[K]:
        """Keys >= ``key`` in ascending order. Do not mutate the index while iterating."""
        lists = self._lists
        pos = bisect_left(self._maxes, key)
        if pos == len(lists):
            return
        sub = lists[pos]
        i = bisect_left(sub, key)
        yield from sub[i:] if i else sub
        for j in range(pos + 1, len(lists)):
            yield from lists[j]

    def __iter__(self) -> Iterator[K]:
        for sub in self._lists:
            yield from sub

    def last(self) -> K | None:
        return self._maxes[-1] if self._maxes else None
