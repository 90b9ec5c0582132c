"""Depth-bounded JSON decoding for the extender's request bodies.

Role: refuse a body nested deeper than `MAX_DEPTH` arrays/objects *before* ``json.loads`` recurses
into it, so that hostile nesting (``[[[[...`` a thousand levels deep) is a clear `JsonDepthError`
(HTTP 400) instead of a ``RecursionError`` deep in the decoder or in the code that walks the result.

Invariant: `loads` returns exactly what ``json.loads`` returns for every document of depth <=
`MAX_DEPTH`, and raises `JsonDepthError` (a ``ValueError``) for every deeper one. Brackets inside
JSON strings do not count. The check works on the bytes with C-speed ``re`` / ``bytes`` operations:
strings are dropped, everything but brackets deleted, then innermost ``[]``/``{}`` pairs are peeled
off one round per level; whatever is left after `MAX_DEPTH` rounds is nested too deeply.

kube-scheduler's extender arguments (pods and nodes as JSON) nest about ten levels deep.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 100
"""Deepest accepted nesting of arrays/objects (json.loads itself fails near 1,000 on CPython)."""

_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonDepthError(ValueError):
    """The document nests arrays/objects deeper than the limit."""


def nesting_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when ``raw`` nests arrays/objects (outside strings) more than ``limit`` levels deep.

    Each round deletes the pairs that are adjacent *before* the round (``re.sub`` does not rescan
    its output), i.e. exactly one level of the tree's height; a document of depth d empties in d.
    Unbalanced brackets that could still nest more than ``limit`` deep also count as too deep."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    # NOTE: drop escaped backslashes, then escaped quotes (valid JSON has them only inside strings),
    # so every remaining quote opens or closes a string: the even pieces of a split are the outside
    unquoted = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unquoted.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        peeled = _PAIR.sub(b"", brackets)
        if len(peeled) == len(brackets):
            return len(brackets) > limit  # NOTE: unbalanced: not JSON; json.loads says why if shallow
        brackets = peeled
    return bool(brackets)


def loads(raw: bytes, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` for documents nested at most ``limit`` deep; `JsonDepthError` otherwise."""
    if nesting_exceeds(raw, limit):
        raise JsonDepthError(f"JSON nested deeper than {limit} levels")
    return json.loads(raw)
