"""`gpupool run` stopped by Ctrl-C with traffic and an open event stream, and restarted: real
subprocesses on free ports, real HTTP.

Ctrl-C must stop every server, the traffic and the agents at once (an open ``/v1/events`` stream
used to keep the gateway up for good); a second run starts from an empty lease store unless
``--keep-state``; status lines carry timestamps. The stop time is printed, not asserted (the bound
below is generous: a stop that hangs fails, a slow machine does not).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d ")
STOP_BOUND_S = 15


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Run:
    """One `gpupool run` subprocess whose output lines are collected as they come."""

    def __init__(self, data: Path, *args: str, pass_fds: tuple[int, ...] = ()) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = data
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", "run", "--port", str(self.port),
             "--data-dir", str(data), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, pass_fds=pass_fds,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if re.search(pattern, line):
                    return line
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"gpupool run exited {self.proc.returncode}:\n" + "\n".join(self.lines))
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines))

    def token(self) -> str:
        return (self.data / "admin.token").read_text().strip()

    def get(self, path: str) -> object:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token()}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def wait_up(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.get("/v1/pool")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    def interrupt(self) -> float:
        """Ctrl-C; seconds until the process exited (fails past `STOP_BOUND_S`)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"still running {STOP_BOUND_S} s after Ctrl-C:\n" + "\n".join(self.lines[-20:])
            ) from None
        self._reader.join(10)
        return time.monotonic() - t0


def _hold_event_stream(run: Run, opened: threading.Event) -> None:
    req = urllib.request.Request(run.url + "/v1/events", headers={"Authorization": f"Bearer {run.token()}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            opened.set()
            while resp.read(64):
                pass
    except OSError:
        pass  # NOTE: the server went away: that is the point
    except Exception:  # NOTE: http.client.IncompleteRead and friends at shutdown
        pass


def test_ctrl_c_stops_everything_and_the_next_run_starts_clean(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Run(data)  # traffic, tidal clock and node agents on, as `make run`
    try:
        first.wait_for(r"node agents: 2")
        first.wait_for(r"pool: .* granted")  # a status line: traffic has been flowing for 5 s
        opened = threading.Event()
        threading.Thread(target=_hold_event_stream, args=(first, opened), daemon=True).start()
        assert opened.wait(30), "no /v1/events stream"
        leases = first.get("/v1/leases")
        assert isinstance(leases, dict)
    finally:
        stop_s = first.interrupt()
    print(f"gpupool run stopped {stop_s:.2f} s after Ctrl-C (traffic + an open /v1/events stream)")
    assert first.proc.returncode == 0, "\n".join(first.lines)
    assert first.lines[-1].endswith("gpupool: stopped")
    status = [line for line in first.lines if "pool: " in line or "gpupool gateway on" in line]
    assert status and all(STAMP.match(line) for line in status), status
    assert (data / "leases.db").exists()

    second = Run(data, "--no-traffic", "--tidal-speed", "0", "--no-agents")
    try:
        recovered = second.wait_for(r"recovered \d+ leases")
        second.wait_for(r"fresh start: removed")  # (said once the start went through)
        assert "recovered 0 leases" in recovered, recovered
        second.wait_up()  # serving: the backends' placement leases are stored
    finally:
        second.interrupt()

    third = Run(data, "--no-traffic", "--tidal-speed", "0", "--no-agents", "--keep-state")
    try:
        recovered = third.wait_for(r"recovered \d+ leases")
        n = int(re.search(r"recovered (\d+) leases", recovered).group(1))  # type: ignore[union-attr]
        assert n > 0, recovered  # the backends' placement leases of the second run
        assert "fresh start" not in "\n".join(third.lines)
    finally:
        third.interrupt()
