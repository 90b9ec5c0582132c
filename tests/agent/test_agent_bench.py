"""`gpupool bench agent --json` prints one JSON object of the documented shape (numbers not asserted)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpupool.cli.main import app


def test_bench_agent_json_shape() -> None:
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "agent",
            "--json",
            "--gpus",
            "2",
            "--workloads",
            "2",
            "--ticks",
            "20",
            "--trials",
            "2",
            "--period-ms",
            "50",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["benchmark"] == "agent" and out["period_ms"] == 50
    assert isinstance(out["tick_ms_per_gpu"], float)
    assert set(out["reaction_ms"]) >= {"p50", "p99", "max"}
    assert out["reaction_ms"]["trials"] == 2


def test_bench_agent_bad_input_exits_2() -> None:
    res = CliRunner().invoke(app, ["bench", "agent", "--pauser", "magic"])
    assert res.exit_code == 2
