"""Typed ids and lease-id generation.

Lease ids are real UUIDs (version 4, 122 random bits). Production uses the OS CSPRNG (`os.urandom`,
formatted directly: `uuid.uuid4`'s ``str()`` costs about twice as much per id); the simulator
and tests inject a seeded factory so runs are reproducible (`seeded_lease_ids`).

`random_bytes16` reads the OS random source 4 KiB at a time and hands out 16-byte pieces (one
system call per 256 ids instead of one per id: the proxy draws two ids per request). Invariants:
each piece is handed out once (a list iterator's ``next`` is atomic under the GIL, so threads
never share one), and a forked child drops the parent's unused pieces (`os.register_at_fork`).
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable, Iterator
from typing import NewType

SliceId = NewType("SliceId", str)
LeaseId = NewType("LeaseId", str)
RequestId = NewType("RequestId", str)
NodeName = NewType("NodeName", str)
GpuId = NewType("GpuId", str)
TenantId = NewType("TenantId", str)

LeaseIdFactory = Callable[[], LeaseId]


_BATCH = 256


class _Batch:
    """The unused 16-byte pieces of the last read from the OS random source."""

    __slots__ = ("pieces",)

    def __init__(self) -> None:
        self.pieces: Iterator[bytes] = iter(())

    def forget(self) -> None:
        self.pieces = iter(())


_BUFFER = _Batch()
os.register_at_fork(after_in_child=_BUFFER.forget)


def random_bytes16() -> bytes:
    """16 bytes from the OS random source (read in batches, see the module docstring)."""
    buf = _BUFFER
    while True:
        piece = next(buf.pieces, None)
        if piece is not None:
            return piece
        raw = os.urandom(16 * _BATCH)
        buf.pieces = iter([raw[i : i + 16] for i in range(0, 16 * _BATCH, 16)])


def random_lease_id() -> LeaseId:
    """A fresh UUID4 from the OS random source (the same text as ``str(uuid.uuid4())`` would be)."""
    h = random_bytes16().hex()
    return LeaseId(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}")


_VARIANT = "89ab"
"""RFC 4122 variant nibbles (10xx): the two random bits left in the clock-seq high nibble."""


def seeded_lease_ids(seed: int) -> LeaseIdFactory:
    """A deterministic UUID4 stream for simulations and tests (never for production ids)."""
    rng = random.Random(seed)

    def make() -> LeaseId:
        return LeaseId(str(uuid.UUID(int=rng.getrandbits(128), version=4)))

    return make
