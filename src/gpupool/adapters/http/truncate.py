"""Opt-in truncation of chat requests that cannot fit the model's context: ``x-gpupool-truncate:
oldest-turns`` drops the oldest *turns* (a user message with the assistant / tool messages that
follow it) until the request fits, keeping every system / developer message, the tool definitions
(``tools`` is not a message) and the latest turn. The answer carries ``x-gpupool-truncated:
turns=N; tokens=M`` (M estimated the way the proxy estimates prompts). Never silent, never without
the header: a request that did not opt in keeps the proxy's 400 ``context_length_exceeded``.

Invariants: the kept messages are in their original order; the last turn is never dropped; an
unknown header value is a 400 naming the header and the value; no state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRUNCATE_HEADER = "x-gpupool-truncate"
TRUNCATED_HEADER = "x-gpupool-truncated"
MODES = ("oldest-turns",)
KEPT_ROLES = ("system", "developer")


def truncate_mode(value: str | None) -> str:
    """The opt-in mode ("" when absent); raises ValueError naming the header and the value."""
    if value is None or value == "":
        return ""
    if value not in MODES:
        raise ValueError(f"{TRUNCATE_HEADER}: {value[:40]!r} is not one of {', '.join(MODES)}")
    return value


def _turns(messages: list[Any]) -> list[list[int]]:
    """Indices of the droppable messages grouped into turns (each starts at a user message)."""
    turns: list[list[int]] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role in KEPT_ROLES:
            continue
        if role == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return turns


def drop_oldest_turns(messages: list[Any], fits: Callable[[list[Any]], bool]) -> tuple[list[Any], int] | None:
    """(kept messages, turns dropped) for the fewest oldest turns dropped so that ``fits`` holds;
    (messages, 0) if they fit already; None if even the system messages + the last turn do not."""
    if fits(messages):
        return messages, 0
    turns = _turns(messages)
    dropped: set[int] = set()
    for n, turn in enumerate(turns[:-1], 1):
        dropped.update(turn)
        kept = [m for i, m in enumerate(messages) if i not in dropped]
        if fits(kept):
            return kept, n
    return None
