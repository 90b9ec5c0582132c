"""Priorities: integers, higher = more urgent (as Kubernetes PriorityClass and the inference gateway).

Named bands from the seed:
- ``P0`` = 100: online agent interaction.
- ``P1`` = 50: online embedding / retrieval.
- ``P2`` = -1: offline batch, preemptible by default.

Convert to vLLM's "lower is more urgent" only at the vLLM boundary (`to_vllm_priority`).
"""

from __future__ import annotations

from gpupool.core.errors import InvalidInput

P0 = 100
P1 = 50
P2 = -1

PRIORITY_MIN = -1_000_000_000
PRIORITY_MAX = 1_000_000_000

_NAMED = {"P0": P0, "P1": P1, "P2": P2}


def parse_priority(value: object, *, field: str = "priority") -> int:
    """Accept ``"P0"|"P1"|"P2"`` (any case) or an integer in [-1e9, 1e9]."""
    if isinstance(value, str):
        named = _NAMED.get(value.strip().upper())
        if named is not None:
            return named
        try:
            value = int(value.strip())
        except ValueError:
            raise InvalidInput(field, value, "expected P0, P1, P2 or an integer") from None
    if type(value) is not int:
        raise InvalidInput(field, value, "expected P0, P1, P2 or an integer")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidInput(field, value, f"must be within [{PRIORITY_MIN}, {PRIORITY_MAX}]")
    return value


def band(priority: int) -> str:
    """The band name used in metrics and logs: >= 100 is P0, >= 0 is P1, below 0 is P2."""
    if priority >= P0:
        return "P0"
    if priority >= 0:
        return "P1"
    return "P2"


def is_preemptible_by_default(priority: int) -> bool:
    """Batch work (negative priority) is preemptible unless the request says otherwise."""
    return priority < 0


def to_vllm_priority(priority: int) -> int:
    """vLLM schedules lower values first; invert at that boundary only."""
    return -priority
