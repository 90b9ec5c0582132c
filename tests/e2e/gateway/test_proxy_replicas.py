"""Proxy replicas as real processes: one leader (`gpupool serve`), one emulated backend and two
`gpupool proxy` replicas. Requests through either replica are granted inside that replica's KV
share (no request reaches the leader); each share is a lease in the leader's KV ledger; a replica
killed with SIGKILL loses its share only when the share lease expires, and the other keeps
serving; a replica stopped with SIGTERM gives its share back at once; the leader's backend options
(here the context length) reach the replicas' proxies; bad share calls are 4xx naming the field and
change nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.bench.httpload import stop, wait_http
from gpupool.cli.serving import free_port

pytestmark = pytest.mark.slow

ADMIN = "replica-admin-token-01"
TENANT = "replica-tenant-token-01"
MODEL = "qwen2.5-0.5b"
TTL_S = 1.5
CLUSTER = "nodes:\n  - name: n0\n    gpus: [{model: H100-SXM5-80GB, count: 1}]\n"


def _gpupool(*args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUPOOL_LEADER_TOKEN": ADMIN}
    with log.open("ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", *args], env=env, stdout=f, stderr=f
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, object]]:
    (tmp_path / "cluster.yaml").write_text(
        "nodes:\n  - name: n0\n    gpus: [{model: H100-SXM5-80GB, count: 1}]\n"
    )
    (tmp_path / "workloads.yaml").write_text(
        f"workloads:\n  - {{name: llm, model: {MODEL}, priority: P1, replicas: 1, isolation: any}}\n"
    )
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {TENANT}, tenant: t, role: tenant}}\n"
    )
    bport, lport = free_port(), free_port()
    (tmp_path / "backends.yaml").write_text(
        f"backends:\n  - {{id: b0, model: {MODEL}, url: 'http://127.0.0.1:{bport}', "
        "slice_id: n0/0/mps-llm-0, max_model_len: 512}\n"
    )
    log = tmp_path / "log.txt"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _gpupool("emulate-backend", "--model", MODEL, "--port", str(bport), "--speed", "1000", log=log)
        )
        wait_http(f"http://127.0.0.1:{bport}/v1/models", procs[-1], what="backend")
        procs.append(
            _gpupool(
                "serve", "--port", str(lport), "--data-dir", str(tmp_path / "data"),
                "--cluster", str(tmp_path / "cluster.yaml"), "--workloads", str(tmp_path / "workloads.yaml"),
                "--auth-file", str(auth), "--backends", str(tmp_path / "backends.yaml"),
                "--no-simulate-readings", log=log,
            )
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{lport}/healthz", procs[-1], what="leader")
        ports = []
        for i in range(2):
            port = free_port()
            procs.append(
                _gpupool(
                    "proxy", "--leader", f"http://127.0.0.1:{lport}", "--auth-file", str(auth),
                    "--port", str(port), "--replica-id", f"rep{i}", "--share-ttl-s", str(TTL_S),
                    "--workloads", str(tmp_path / "workloads.yaml"), log=log,
                )
            )  # fmt: skip
            ports.append(port)
        for i, port in enumerate(ports):
            _until(
                lambda p=port: httpx.get(f"http://127.0.0.1:{p}/healthz").status_code == 200,
                f"replica {i} ok",
            )
        yield {"leader": lport, "replicas": ports, "procs": procs, "log": log}
    finally:
        stop(procs)


def _until(cond: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():  # type: ignore[operator]
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not reached within {timeout_s} s: {what}")


def _complete(port: int) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": MODEL, "prompt": "hello", "max_tokens": 4},
        headers={"Authorization": f"Bearer {TENANT}"},
        timeout=30,
    )


def _shares(lport: int) -> dict[str, int]:
    r = httpx.get(f"http://127.0.0.1:{lport}/v1/kv/shares", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return {k.split("/")[0]: v for k, v in r.json()["backends"]["b0"].items()}


def test_replicas_grant_inside_their_shares_and_a_dead_one_loses_only_its_share(
    cluster: dict[str, object],
) -> None:
    lport = int(cluster["leader"])  # type: ignore[call-overload]
    ports: list[int] = cluster["replicas"]  # type: ignore[assignment]
    procs: list[subprocess.Popen[bytes]] = cluster["procs"]  # type: ignore[assignment]
    admin = {"Authorization": f"Bearer {ADMIN}"}
    calls_before = httpx.get(f"http://127.0.0.1:{lport}/v1/kv/shares", headers=admin).json()["calls"]
    for port in ports:
        for _ in range(20):
            r = _complete(port)
            assert r.status_code == 200, r.text
            assert r.headers["x-gpupool-backend"] == "b0" and r.headers["x-gpupool-lease"]
    # the leader's backend options travel with the shares: the model's context is 512 here too
    r = httpx.post(
        f"http://127.0.0.1:{ports[0]}/v1/completions",
        json={"model": MODEL, "prompt": "hello", "max_tokens": 600},
        headers={"Authorization": f"Bearer {TENANT}"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    shares = _shares(lport)
    assert set(shares) == {"rep0", "rep1"} and all(v > 0 for v in shares.values())
    budget = httpx.get(f"http://127.0.0.1:{lport}/v1/kv/shares", headers=admin).json()["budgets"]["b0"]
    assert sum(shares.values()) <= budget
    # 40 requests went through; the leader saw share calls only (a few per second per replica)
    calls = httpx.get(f"http://127.0.0.1:{lport}/v1/kv/shares", headers=admin).json()["calls"] - calls_before
    assert calls < 40
    # the shares are leases in the leader's ledger (not request leases): its request-lease count is 0
    pool = httpx.get(f"http://127.0.0.1:{lport}/v1/pool", headers=admin).json()
    assert pool["request_leases"] == 0
    # kill -9 replica 0: its share stays booked until the share lease expires, then it is gone
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait(10)
    _until(lambda: "rep0" not in _shares(lport), "the dead replica's share expired", timeout_s=TTL_S * 10)
    assert "rep1" in _shares(lport)
    assert _complete(ports[1]).status_code == 200
    # SIGTERM replica 1: it gives its share back on the way out
    procs[3].send_signal(signal.SIGTERM)
    procs[3].wait(15)
    assert "rep1" not in _shares(lport)


def test_bad_and_stale_share_calls_are_4xx_and_change_nothing(cluster: dict[str, object]) -> None:
    lport = int(cluster["leader"])  # type: ignore[call-overload]
    url = f"http://127.0.0.1:{lport}/v1/kv/shares"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    good = {"replica": "x", "incarnation": "i", "seq": 5, "ttl_s": 2.0, "shares": {}}
    assert httpx.post(url, json=good, headers={"Authorization": f"Bearer {TENANT}"}).status_code == 403
    assert httpx.post(url, json=good).status_code == 401
    before = _shares(lport)
    for bad, field in (
        ({"ttl_s": 0.01}, "ttl_s"),
        ({"seq": -1}, "seq"),
        ({"replica": "a/b"}, "replica"),
        ({"shares": {"nope": {"hold_mib": 0, "used_mib": 0, "want_mib": 1}}}, "shares.nope"),
        ({"shares": {"b0": {"hold_mib": -1, "used_mib": 0, "want_mib": 1}}}, "hold_mib"),
    ):
        r = httpx.post(url, json=good | bad, headers=admin)
        assert r.status_code == 422 and field in r.text, (bad, r.status_code, r.text)
    want = {"shares": {"b0": {"hold_mib": 0, "used_mib": 0, "want_mib": 64}}}
    r = httpx.post(url, json=good | want, headers=admin)
    assert r.status_code == 200 and r.json()["shares"]["b0"]["share_mib"] == 64
    r = httpx.post(url, json=good, headers=admin)  # the same seq again: a delayed retry
    assert r.status_code == 409 and r.json()["code"] == "stale_seq"
    after = _shares(lport)
    assert after.pop("x") == 64 and after.keys() == before.keys()
