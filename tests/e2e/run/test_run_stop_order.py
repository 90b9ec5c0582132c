"""`gpupool run` stops its node agents before its gateway: a real subprocess on a free port, real
HTTP. With the gateway closed first, an agent's report in flight (every 200 ms) met a refused
connection, and a clean Ctrl-C printed ``Connection refused ... retrying``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.run.test_run_shutdown import Run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROUNDS = 4
"""Ctrl-C several times: each stop is one chance for a report to meet a closed gateway."""


def test_ctrl_c_stops_the_agents_before_the_gateway(tmp_path: Path) -> None:
    for i in range(ROUNDS):
        run = Run(tmp_path / f"data{i}", "--no-traffic", "--tidal-speed", "0")
        try:
            run.wait_for(r"node agents: 2")
            run.wait_up()
        finally:
            run.interrupt()
        out = "\n".join(run.lines)
        assert run.proc.returncode == 0, out
        assert "Connection refused" not in out and "retrying" not in out, out
        assert run.lines[-1].endswith("gpupool: stopped"), out
