"""Lease ids: `random_lease_id` gives RFC 4122 version-4 UUIDs in their canonical text, all distinct."""

from __future__ import annotations

import uuid

from gpupool.core.ids import random_lease_id


def test_random_lease_ids_are_canonical_distinct_uuid4s() -> None:
    ids = [random_lease_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    variants = set()
    for x in ids:
        u = uuid.UUID(x)
        assert u.version == 4 and u.variant == uuid.RFC_4122, x
        assert str(u) == x  # lower-case hex, dashes at 8-4-4-4-12
        variants.add(x[19])
    assert variants == set("89ab")  # both free bits of the variant nibble are random
