"""Typed ids and lease-id generation.

Lease ids are real UUIDs (version 4, 122 random bits). Production uses the OS CSPRNG (`os.urandom`,
formatted directly: `uuid.uuid4`'s ``str()`` costs about twice as much per id); the simulator
and tests inject a seeded factory so runs are reproducible (`seeded_lease_ids`).
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable
from typing import NewType

SliceId = NewType("SliceId", str)
LeaseId = NewType("LeaseId", str)
RequestId = NewType("RequestId", str)
NodeName = NewType("NodeName", str)
GpuId = NewType("GpuId", str)
TenantId = NewType("TenantId", str)

LeaseIdFactory = Callable[[], LeaseId]


def random_lease_id() -> LeaseId:
    """A fresh UUID4 from the OS random source (the same text as ``str(uuid.uuid4())`` would be)."""
    h = os.urandom(16).hex()
    return LeaseId(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}")


_VARIANT = "89ab"
"""RFC 4122 variant nibbles (10xx): the two random bits left in the clock-seq high nibble."""


def seeded_lease_ids(seed: int) -> LeaseIdFactory:
    """A deterministic UUID4 stream for simulations and tests (never for production ids)."""
    rng = random.Random(seed)

    def make() -> LeaseId:
        return LeaseId(str(uuid.UUID(int=rng.getrandbits(128), version=4)))

    return make
