"""Bad input to `gpupool serve` / `gpupool emulate-backend`: exit code 2 with one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_serve_bad_auth_file_and_missing_cluster(tmp_path: Path) -> None:
    bad = tmp_path / "auth.yaml"
    bad.write_text("tokens:\n  - {token: short, tenant: a}\n")
    r = run("serve", "--auth-file", str(bad), "--data-dir", str(tmp_path / "d"), "--port", "0")
    assert r.returncode == 2 and "tokens[0].token" in r.stderr and "Traceback" not in r.stderr
    r = run("serve", "--cluster", str(tmp_path / "nope.yaml"), "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2 and "no such file" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_emulate_backend_bad_model_and_fraction() -> None:
    r = run("emulate-backend", "--model", "no-such-model", "--port", "0")
    assert r.returncode == 2 and "no-such-model" in r.stderr and "Traceback" not in r.stderr
    r = run("emulate-backend", "--model", "qwen2.5-0.5b", "--compute-fraction", "2")
    assert r.returncode == 2 and "--compute-fraction" in r.stderr


def test_emulate_backend_vram_hold_needs_its_registry_and_gpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("GPUPOOL_SIM_VRAM_DIR", raising=False)
    args = ("emulate-backend", "--model", "qwen2.5-0.5b", "--port", "0", "--hold-vram-mib", "2048")
    r = run(*args, "--hold-on", "gpu-a/0")
    assert r.returncode == 2 and "GPUPOOL_SIM_VRAM_DIR" in r.stderr and "Traceback" not in r.stderr
    monkeypatch.setenv("GPUPOOL_SIM_VRAM_DIR", str(tmp_path / "vram"))
    r = run(*args)
    assert r.returncode == 2 and "--hold-on" in r.stderr
    r = run(*args, "--hold-on", "gpu-a/0", "--sleep-vram-mib", "4096")
    assert r.returncode == 2 and "--sleep-vram-mib" in r.stderr
    assert not (tmp_path / "vram").exists()  # nothing was held


def test_emulate_backend_holds_no_vram_when_another_option_is_bad(tmp_path: Path, monkeypatch) -> None:
    """The VRAM record was written before --quant, --scheduling-policy, ... were checked: a
    rejected start left the registry claiming memory on the GPU."""
    monkeypatch.setenv("GPUPOOL_SIM_VRAM_DIR", str(tmp_path / "vram"))
    args = ("emulate-backend", "--model", "qwen2.5-0.5b", "--port", "0", "--hold-vram-mib", "1000")
    for bad, named in (
        (("--quant", "bogus"), "--quant"),
        (("--scheduling-policy", "lifo"), "--scheduling-policy"),
        (("--kv-budget-mib", "0"), "--kv-budget-mib"),
        (("--model", "no-such-model"), "no-such-model"),
    ):
        r = run(*args, "--hold-on", "gpu-a/0", *bad)
        assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "vram").exists(), bad  # nothing was held


def test_proxy_replica_bad_options_exit_2_naming_the_option(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  - {token: replica-admin-token-01, tenant: ops, role: admin}\n")
    base = ("proxy", "--auth-file", str(auth), "--leader-token", "replica-admin-token-01")
    for extra, named in (
        (("--leader", "ftp://x"), "--leader"),
        (("--leader", "http://127.0.0.1:9", "--share-ttl-s", "0.1"), "--share-ttl-s"),
        (("--leader", "http://127.0.0.1:9", "--max-wait-s", "0"), "--max-wait-s"),
        (("--leader", "http://127.0.0.1:9", "--replica-id", "a/b"), "--replica-id"),
        (("--leader", "http://127.0.0.1:9", "--port", "70000"), "--port"),
    ):
        r = run(*base, *extra)
        assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    r = run("bench", "replicas", "--replicas", "0,2", "--sim-only")
    assert r.returncode == 2 and "--replicas" in r.stderr


def test_proxy_replica_with_a_token_the_leader_refuses_exits_2_naming_it(tmp_path: Path) -> None:
    """A real leader (`gpupool serve`): an unknown token (401) and a tenant's token (403) stop the
    replica at its first share call with one line naming --leader-token and the leader's reason
    (it ran on, logging ``RuntimeError: HTTP 401: b'{...}'`` every second)."""
    from gpupool.bench.httpload import stop, wait_http
    from gpupool.cli.serving import free_port

    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n  - {token: replica-admin-token-01, tenant: ops, role: admin}\n"
        "  - {token: replica-tenant-token-01, tenant: t, role: tenant}\n"
    )
    (tmp_path / "cluster.yaml").write_text(
        "nodes:\n  - name: n0\n    gpus: [{model: H100-SXM5-80GB, count: 1}]\n"
    )
    (tmp_path / "w.yaml").write_text(
        "workloads:\n  - {name: llm, model: qwen2.5-0.5b, priority: P1, replicas: 1, isolation: any}\n"
    )
    lport = free_port()
    leader = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "serve", "--port", str(lport), "--data-dir",
         str(tmp_path / "d"), "--cluster", str(tmp_path / "cluster.yaml"), "--workloads",
         str(tmp_path / "w.yaml"), "--auth-file", str(auth), "--no-simulate-readings"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{lport}/healthz", leader, what="leader")
        base = ("proxy", "--leader", f"http://127.0.0.1:{lport}", "--auth-file", str(auth), "--port", "0")
        for token, reason in (
            ("not-a-token-of-the-leader", "HTTP 401"),
            ("replica-tenant-token-01", "HTTP 403"),
        ):
            r = run(*base, "--leader-token", token, timeout=30)  # it ran forever: a hang detector
            assert r.returncode == 2, (token, r.stderr)
            assert r.stderr.startswith("gpupool: error: --leader-token:") and reason in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "b'" not in r.stderr, r.stderr
            assert token not in r.stderr  # a secret is not echoed
    finally:
        stop([leader])
