"""Typed ids and lease-id generation.

Lease ids are real UUIDs (version 4). Production uses the OS CSPRNG via `uuid.uuid4`; the simulator
and tests inject a seeded factory so runs are reproducible (`seeded_lease_ids`).
"""

from __future__ import annotations

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
    """A fresh UUID4 from the OS random source."""
    return LeaseId(str(uuid.uuid4()))


def seeded_lease_ids(seed: int) -> LeaseIdFactory:
    """A deterministic UUID4 stream for simulations and tests (never for production ids)."""
    rng = random.Random(seed)

    def make() -> LeaseId:
        return LeaseId(str(uuid.UUID(int=rng.getrandbits(128), version=4)))

    return make
