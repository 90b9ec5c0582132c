"""Ctrl-C and SIGTERM during start-up of the long-running commands (`gpupool serve`, `gpupool run`).

Role: between the command's start and the moment `serve_forever` installs its event-loop signal
handlers, a signal used to raise `KeyboardInterrupt` wherever the main thread happened to be. Raised
inside a weakref callback or a ``__del__``, Python prints "Exception ignored" and goes on, so the
process came up and served as if the signal had never arrived.

Invariant: once `catch_early_stop` ran, a SIGINT/SIGTERM is never lost: it is noted (`stop_requested`)
and then raised as `KeyboardInterrupt` (Ctrl-C still interrupts a slow start-up); `serve_forever`
checks the note right after installing its own handlers and stops at once when it is set.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_requested = threading.Event()


def _note(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    raise KeyboardInterrupt


def catch_early_stop() -> None:
    """Install the start-up handlers (main thread only; elsewhere this does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _requested.clear()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _note)


def stop_requested() -> bool:
    """True when a signal arrived since `catch_early_stop`."""
    return _requested.is_set()
