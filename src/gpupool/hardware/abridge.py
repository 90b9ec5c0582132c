"""Bounded reprs of values for one-line error messages (`abridger`).

Role: an error names the value it refuses, but the value may be huge (a megabyte-long name, a YAML
alias structure of 10**9 items): its repr is abridged with ``...`` past a number of items per
container, of characters per string and of nesting levels, so reporting it costs no more than a
small one. Used by the spec parser (`gpupool.hardware.spec`) and the core's errors
(`gpupool.core.errors`), each with its own limits. Standard library only (`reprlib`).
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable


def abridger(*, items: int, chars: int, levels: int) -> Callable[[object], str]:
    """``repr`` abridged past ``items`` per list/tuple/set/dict, ``chars`` per string (and per other
    object's repr) and ``levels`` of nesting (at most ``items ** levels`` elements are walked)."""
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdict = items
    r.maxstring = r.maxother = chars
    r.maxlevel = levels
    r.maxlong = 40
    return r.repr
