"""Smoke run of `gpupool bench preempt` with tiny sizes: a real CLI process, real holder children on
a simulated GPU, every path reports exactly ``p50_ms`` and ``p99_ms`` (numbers are not asserted), and
bad options exit 2 naming the option."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "bench", "preempt", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)


def test_preempt_bench_json_has_exactly_the_documented_keys() -> None:
    out = _bench("--json", "--runs", "1", "--holders", "1", "--grace-ms", "100")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"paths", "runs"} and doc["runs"] == 1
    assert set(doc["paths"]) == {"signal-kill", "sigterm", "sleep"}
    for figures in doc["paths"].values():
        assert set(figures) == {"p50_ms", "p99_ms"}
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]


@pytest.mark.parametrize(
    ("args", "named"),
    [(("--paths", "teleport"), "--paths"), (("--runs", "0"), "--runs"), (("--holders", "99"), "--holders")],
)
def test_preempt_bench_bad_options_exit_2(args: tuple[str, ...], named: str) -> None:
    out = _bench(*args)
    assert out.returncode == 2 and named in out.stderr + out.stdout
