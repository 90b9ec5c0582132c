"""Lease ids: `random_lease_id` gives RFC 4122 version-4 UUIDs in their canonical text, all distinct,
across the refills of the batched random source and across a fork (the child never hands out the
parent's buffered bytes)."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

from gpupool.core.ids import random_bytes16, random_lease_id


def test_random_lease_ids_are_canonical_distinct_uuid4s() -> None:
    ids = [random_lease_id() for _ in range(2000)]  # several refills of the 256-piece batch
    assert len(set(ids)) == len(ids)
    variants = set()
    for x in ids:
        u = uuid.UUID(x)
        assert u.version == 4 and u.variant == uuid.RFC_4122, x
        assert str(u) == x  # lower-case hex, dashes at 8-4-4-4-12
        variants.add(x[19])
    assert variants == set("89ab")  # both free bits of the variant nibble are random


def test_random_bytes_are_16_bytes_and_never_repeat_across_refills() -> None:
    pieces = [random_bytes16() for _ in range(1000)]
    assert all(type(p) is bytes and len(p) == 16 for p in pieces)
    assert len(set(pieces)) == len(pieces)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs os.fork")
def test_a_forked_child_does_not_reuse_the_parents_buffered_random_bytes() -> None:
    random_bytes16()  # the parent now holds a batch of unused pieces
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next piece, exit without running the test harness
        try:
            os.write(w, random_bytes16())
        finally:
            os._exit(0)
    os.close(w)
    child = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    parent_next = [random_bytes16() for _ in range(300)]  # the rest of the parent's batch and more
    assert len(child) == 16
    assert child not in parent_next
