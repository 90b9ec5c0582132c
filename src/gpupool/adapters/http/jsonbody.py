"""Bounded JSON decoding of request bodies: `loads` turns any byte string into a JSON value or a
`JsonBodyError` that says what is wrong, where, and never a 5xx.

Invariants of a value `loads` returns:
- nesting depth <= ``max_depth`` (default `MAX_DEPTH`); deeper input is refused before any
  recursive consumer (pydantic, ``json.dumps``, a handler) can hit Python's recursion limit;
- every string (keys too) encodes to UTF-8: a lone surrogate escape such as ``"\\ud800"`` is
  refused, naming the field, so it can never be stored and then break every later response;
- no ``NaN`` / ``Infinity`` / ``-Infinity`` literals (not JSON) and no integer literal longer than
  Python's int-parsing digit limit (refused with a message instead of a ``ValueError``);
- with ``unique_keys`` (the gateway's own API: leases, admin, nodes, batch), no object names a key
  twice: ``{"priority": "P2", "priority": "P0"}`` is refused, not read as its last value (a proxy or
  firewall in front that keeps the first would see another request than the gateway). The OpenAI
  proxy's bodies are decoded without it: they go to the backend as sent, and its parser decides.

`JsonBodyError.field` is a dotted path into the body (``labels.k``, ``messages.0.content``) or
``body`` for the document as a whole; ``str(err)`` is one line with the problem and, for syntax
errors, the line and column. Framework-free: any route (lease API, OpenAI proxy) can call it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MAX_DEPTH = 64
"""Containers nested deeper than this are refused (real API bodies nest a handful of levels)."""


class JsonBodyError(ValueError):
    """A request body that is not acceptable JSON. ``field``: dotted path or ``body``."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(problem if field == "body" else f"{field}: {problem}")


def _no_constants(name: str) -> Any:
    raise JsonBodyError("body", f"{name} is not valid JSON (numbers must be finite)")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)
"""What ``json.loads(text, parse_constant=...)`` builds on every call (one decoder and scanner)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise JsonBodyError(k, "key appears twice in one object (JSON names must be unique)")
            seen.add(k)
    return out


_UNIQUE_DECODER = json.JSONDecoder(parse_constant=_no_constants, object_pairs_hook=_unique)


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH, unique_keys: bool = False) -> Any:
    """Decode ``data`` (UTF-8 bytes or text) as one JSON document under the invariants above."""
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonBodyError("body", f"body is not UTF-8 (invalid byte at offset {exc.start})") from None
    else:
        text = data
    if not text or text.isspace():
        raise JsonBodyError("body", "empty body: expected a JSON document")
    try:
        value = (_UNIQUE_DECODER if unique_keys else _DECODER).decode(text)
    except JsonBodyError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonBodyError(
            "body", f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise JsonBodyError("body", f"JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # an integer literal past sys.get_int_max_str_digits()
        limit = sys.get_int_max_str_digits()
        why = f"integer literal longer than {limit} digits" if "digits" in str(exc) else str(exc)
        raise JsonBodyError("body", f"malformed JSON: {why}") from None
    if text is not data and _plain(text, max_depth):  # (decoded from bytes: valid UTF-8)
        return value  # fast path: too few brackets to nest that deep, no \u escape to make a surrogate
    check(value, max_depth=max_depth)
    return value


def loads_bounded(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """`loads` under the name the OpenAI proxy uses."""
    return loads(raw, max_depth=max_depth)


def _plain(text: str, max_depth: int) -> bool:
    """True when ``text`` cannot break the invariants: at most ``max_depth`` brackets in all (so no
    container nests deeper) and no ``\\u`` escape (the only way a decoded string can hold a lone
    surrogate, since the text itself is valid UTF-8 or a str from one). Two C-level scans."""
    return text.count("[") + text.count("{") <= max_depth and "\\u" not in text


def check(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise `JsonBodyError` unless ``value`` (already decoded) meets the depth and UTF-8 rules.

    Iterative (an explicit stack), so it is safe on any depth json.loads could produce."""
    stack: list[tuple[Any, tuple[str, ...], int]] = [(value, (), 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            _utf8(v, path)
        elif isinstance(v, dict | list):
            if depth >= max_depth:
                raise JsonBodyError(_dotted(path), f"JSON nested deeper than {max_depth} levels")
            if isinstance(v, dict):
                for k, item in v.items():
                    _utf8(k, (*path, k))
                    stack.append((item, (*path, k), depth + 1))
            else:
                stack.extend((item, (*path, str(i)), depth + 1) for i, item in enumerate(v))


def _utf8(s: str, path: tuple[str, ...]) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = s[exc.start]
        raise JsonBodyError(
            _dotted(path), f"string holds a lone surrogate \\u{ord(bad):04x} (not valid Unicode text)"
        ) from None


def _dotted(path: tuple[str, ...]) -> str:
    """The path as ``a.b.0`` (keys with lone surrogates shown as ``\\ud800``, so the path is UTF-8)."""
    if not path:
        return "body"
    return ".".join(p.encode("utf-8", "backslashreplace").decode("utf-8") for p in path)
