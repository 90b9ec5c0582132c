"""Polling helper for the pause tests (a liveness wait with a generous bound, not a timing assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return pred()
