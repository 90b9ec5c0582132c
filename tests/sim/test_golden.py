"""A small synthetic golden trace: `gpupool sim fgd --json` output must match the stored JSON exactly.

Regenerate after an intended change with ``GPUPOOL_UPDATE_GOLDEN=1 pytest tests/sim/test_golden.py``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.sim.policies import SIM_POLICIES

GOLDEN = Path(__file__).parent / "golden"
POLICIES = list(SIM_POLICIES)


@pytest.mark.parametrize("policy", POLICIES)
def test_golden_report_json(policy: str) -> None:
    args = ["sim", "fgd", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(GOLDEN / "nodes.csv")]
    result = CliRunner().invoke(app, [*args, "--policy", policy, "--seeds", "42,43,44", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    path = GOLDEN / f"expected_{policy}.json"
    if os.environ.get("GPUPOOL_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(path.read_text())
