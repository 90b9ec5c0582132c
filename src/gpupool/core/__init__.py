"""Layer 2: the scheduling core. Standard library + :mod:`gpupool.hardware` only; time is injected.

Public surface: `Allocator` (filter -> score -> reserve over a `SliceLedger` and a `LeaseTable`),
`Request`, `Lease`, `Outcome`/`OutcomeCode`, priorities, the watermark machine, and the errors.
"""

from gpupool.core.allocator import Allocator
from gpupool.core.clock import Clock, ManualClock
from gpupool.core.errors import DuplicateId, GpupoolError, InvalidInput, InvariantViolation, UnknownId
from gpupool.core.model import Grant, Lease, LeaseState, Request
from gpupool.core.outcome import Outcome, OutcomeCode
from gpupool.core.priority import P0, P1, P2, parse_priority
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

__all__ = [
    "P0",
    "P1",
    "P2",
    "Allocator",
    "Clock",
    "DuplicateId",
    "GpupoolError",
    "Grant",
    "InvalidInput",
    "InvariantViolation",
    "Lease",
    "LeaseState",
    "ManualClock",
    "Outcome",
    "OutcomeCode",
    "Request",
    "Resources",
    "Slice",
    "SliceKind",
    "UnknownId",
    "parse_priority",
]
