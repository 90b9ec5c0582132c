"""Depth-bounded JSON decoding for request bodies.

Invariant: `loads_bounded` never raises anything but `JsonBodyError` (a ValueError) for bad input, so a
hostile body (1,000 nested arrays, invalid UTF-8) is a 400, never a RecursionError turned into a 500.
Cost: a body with at most ``max_depth`` brackets in total (every ordinary request) is checked by two
C-level counts; only bracket-heavy bodies are scanned (strings skipped) before decoding.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A string token always matches (to its closing quote or the end), so the scan is linear in the body.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.?)*+(?:"|\Z)|[\[\]{}]', re.DOTALL)


class JsonBodyError(ValueError):
    """The body is not valid JSON, or nests deeper than allowed; the message says which."""


def loads_bounded(raw: bytes, *, max_depth: int = 64) -> Any:
    if raw.count(b"[") + raw.count(b"{") > max_depth:
        depth = 0
        for m in _TOKENS.finditer(raw):
            c = m.group()
            if c in (b"[", b"{"):
                depth += 1
                if depth > max_depth:
                    raise JsonBodyError(f"JSON nests deeper than {max_depth} levels")
            elif c in (b"]", b"}"):
                depth -= 1
    try:
        return json.loads(raw)
    except RecursionError:
        raise JsonBodyError(f"JSON nests deeper than {max_depth} levels") from None
    except UnicodeDecodeError:
        raise JsonBodyError("body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        msg = f"body is not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno})"
        raise JsonBodyError(msg) from None
