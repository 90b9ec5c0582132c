"""A Ctrl-C that lands during start-up is never lost (`gpupool.cli.stopping`).

Before, a SIGINT that arrived before the gateway installed its event-loop handlers raised
`KeyboardInterrupt` wherever the main thread was; inside a weakref callback Python only prints
"Exception ignored" and goes on, so the process came up and served for good. The child below makes
exactly that happen, then starts serving: it must stop by itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CHILD = textwrap.dedent(
    """
    import os, signal, sys, weakref
    from pathlib import Path
    from gpupool.cli.serve import build
    from gpupool.cli.serving import free_port, run_loop, serve_forever
    from gpupool.cli.stopping import catch_early_stop

    catch_early_stop()

    class Thing:
        pass

    thing = Thing()
    ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGINT))
    del thing  # the callback runs; the KeyboardInterrupt raised inside it is ignored by Python
    print("swallowed", flush=True)
    bundle = build(data_dir=Path(sys.argv[1]))
    run_loop(serve_forever(bundle, host="127.0.0.1", port=free_port()))
    print("stopped", flush=True)
    """
)


def test_a_ctrl_c_swallowed_during_start_up_still_stops_the_gateway(tmp_path: Path) -> None:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"still serving after a Ctrl-C during start-up: {exc.stdout!r}") from None
    assert "Exception ignored" in proc.stderr and "KeyboardInterrupt" in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "swallowed" and lines[-1] == "stopped", (proc.stdout, proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
