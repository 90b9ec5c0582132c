"""Bounded renderings of values for one-line error messages (`abridger`, `json_abridger`).

Role: an error names the value it refuses, but the value may be huge (a megabyte-long name, a YAML
alias structure of 10**9 items): its text is abridged with ``...`` past a number of items per
container, of characters per string and of nesting levels, so reporting it costs no more than a
small one. `abridger` writes Python reprs (the spec parser, `gpupool.hardware.spec`);
`json_abridger` writes JSON (``true``, ``null``, ``"x"``), as the values arrive from clients and
config files, falling back to the abridged repr for a value JSON cannot hold (the core's errors,
`gpupool.core.errors`). Standard library only (`reprlib`, `json`).
"""

from __future__ import annotations

import enum
import json
import reprlib
from collections.abc import Callable, Iterable


def abridger(*, items: int, chars: int, levels: int) -> Callable[[object], str]:
    """``repr`` abridged past ``items`` per list/tuple/set/dict, ``chars`` per string (and per other
    object's repr) and ``levels`` of nesting (at most ``items ** levels`` elements are walked)."""
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdict = items
    r.maxstring = r.maxother = chars
    r.maxlevel = levels
    r.maxlong = 40
    return r.repr


def _json_str(s: str) -> str:
    """``s`` as a JSON string, non-ASCII kept but lone surrogates escaped (the text stays UTF-8)."""
    text = json.dumps(s, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(s)
    return text


def json_abridger(*, items: int, chars: int, levels: int) -> Callable[[object], str]:
    """JSON text of a value (enums by their value, tuples and sets as lists, non-string keys as
    strings), abridged like `abridger`: ``"abc..."`` past ``chars`` characters, ``[1, 2, ...]`` past
    ``items`` items, ``[...]`` / ``{...}`` past ``levels`` of nesting. Anything JSON cannot hold (an
    object, bytes) is shown as `abridger`'s repr, as are integers (their digits are bounded there)."""
    rep = abridger(items=items, chars=chars, levels=levels)

    def show(v: object, depth: int) -> str:
        if isinstance(v, enum.Enum):
            v = v.value
        if v is None or isinstance(v, bool):
            return json.dumps(v)
        if isinstance(v, int):
            return rep(int(v))
        if isinstance(v, float):
            return json.dumps(float(v), allow_nan=True)
        if isinstance(v, str):
            return _json_str(v) if len(v) <= chars else _json_str(v[:chars])[:-1] + '..."'
        if isinstance(v, list | tuple | set | frozenset | dict):
            if not v:
                return "{}" if isinstance(v, dict) else "[]"
            if depth >= levels:
                return "{...}" if isinstance(v, dict) else "[...]"
            if isinstance(v, dict):
                pairs: list[tuple[object, object]] = _first(v.items(), items)  # type: ignore[assignment]
                head = [f"{_key(k)}: {show(x, depth + 1)}" for k, x in pairs]
            else:
                xs = _first(v, items)
                if isinstance(v, set | frozenset):
                    xs.sort(key=repr)
                head = [show(x, depth + 1) for x in xs]
            if len(v) > items:
                head.append("...")
            body = ", ".join(head)
            return "{" + body + "}" if isinstance(v, dict) else "[" + body + "]"
        return rep(v)

    def _key(k: object) -> str:
        return show(k if isinstance(k, str) else str(k), levels)

    return lambda v: show(v, 0)


def _first(xs: Iterable[object], n: int) -> list[object]:
    """The first ``n`` elements of an iterable (never more are walked)."""
    out: list[object] = []
    for x in xs:
        if len(out) >= n:
            break
        out.append(x)
    return out
