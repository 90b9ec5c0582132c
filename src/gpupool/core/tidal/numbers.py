"""`finite_number`: the one test the tidal settings and the batch job fields use for "a finite number".

Role: settings and job fields arrive from YAML and JSON, where an integer may be arbitrarily large
(``10**400``) and a boolean is an integer to Python. ``math.isfinite`` raises `OverflowError` on an
integer no float holds; here that integer is simply not finite, so a validator answers with the
field's name instead of a traceback.
"""

from __future__ import annotations

import math


def finite_number(value: object) -> bool:
    """True for an int or float (not a bool) that a float holds as a finite value."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int beyond the float range
        return False


__all__ = ["finite_number"]
