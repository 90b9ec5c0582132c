"""Smoke run of `gpupool bench replicas` with tiny sizes: real backends, a real leader and real
`gpupool proxy` replicas; every documented key is there, every answer is 200, the leader sees share
calls only (far fewer than requests) and the simulator's shares never exceed a budget. Numbers are
not asserted (they are the benchmark's job)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MEASURED_KEYS = {
    "requests_per_s",
    "p50_ms",
    "p99_ms",
    "ok",
    "non_200",
    "non_200_by_status",
    "leader_share_calls_per_s",
    "leader_calls_per_request",
    "cpu_us_per_request",
}


def test_replicas_bench_measures_leader_and_replicas_and_simulates() -> None:
    args = ["--replicas", "1,2", "--clients", "4", "--duration-s", "0.5", "--warmup-s", "0.2"]
    args += ["--backends", "3", "--load-procs", "2"]  # (spawned load generators)
    r = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "bench", "replicas", "--json", *args],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert {"benchmark", "cpus", "load_1m", "clients", "duration_s", "measured", "sim"} <= set(out)
    assert out["backends"] == 3 and out["load_procs"] == 2
    assert set(out["measured"]) == {"leader", "1", "2"}
    for name, m in out["measured"].items():
        assert set(m) == MEASURED_KEYS, name
        assert m["non_200"] == 0 and m["ok"] > 0, (name, m)
        assert set(m["cpu_us_per_request"]) == {"replicas", "leader", "backends"}
    for n in ("1", "2"):
        assert out["measured"][n]["leader_calls_per_request"] < 0.5  # no per-request call to the leader
    assert set(out["sim"]) == {"inputs", "ample", "tight"}
    for kind in ("ample", "tight"):
        assert set(out["sim"][kind]) == {"1", "2"}
        assert all(x["max_shares_over_budget_mib"] == 0 for x in out["sim"][kind].values())
