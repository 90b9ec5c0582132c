"""An address the servers cannot listen on is one line naming the option, exit 2, before anything
starts (`check_listen`): `serve`, `run`, `proxy` and `emulate-backend` with a port in use or a host that does
not resolve; `run` keeps the previous run's lease store when its options or spec files are bad;
`emulate-backend` refuses a GPU model it has no peaks for. Real subprocesses and a real listening socket."""

from __future__ import annotations

import contextlib
import fcntl
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.cli.test_cli_options import assert_one_line_exit_2, gpupool


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "{port}"],
        ["run", "--no-traffic", "--port", "{port}"],
        ["run", "--no-traffic", "--port", "0", "--extender-port", "{port}"],
        ["emulate-backend", "--model", "qwen2.5-0.5b", "--port", "{port}"],
        ["proxy", "--leader", "http://127.0.0.1:9", "--leader-token", "t", "--port", "{port}"],
    ],
)
def test_a_port_in_use_is_exit_2_naming_the_option(argv: list[str], taken_port: int, tmp_path: Path) -> None:
    args = [a.format(port=taken_port) for a in argv]
    if args[0] in ("serve", "run"):
        args += ["--data-dir", str(tmp_path / "data")]
    if args[0] == "proxy":
        auth = tmp_path / "auth.yaml"
        auth.write_text("tokens:\n- {token: a-token-of-24-characters, tenant: t, role: tenant}\n")
        args += ["--auth-file", str(auth)]
    out = gpupool(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupool: error: --host/"), out.stderr
    assert f"cannot listen on 127.0.0.1:{taken_port}" in lines[0]


def test_a_host_that_does_not_resolve_is_exit_2(tmp_path: Path) -> None:
    for argv in (
        ["serve", "--host", "no-such-host.invalid", "--data-dir", str(tmp_path / "d")],
        ["emulate-backend", "--model", "qwen2.5-0.5b", "--host", "no-such-host.invalid"],
    ):
        out = gpupool(*argv)
        assert out.returncode == 2, out.stderr
        assert "--host/--port: cannot listen on no-such-host.invalid:" in out.stderr


def test_run_with_bad_options_keeps_the_last_runs_store(tmp_path: Path, taken_port: int) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "leases.db").write_bytes(b"the last run's ledger")
    out = gpupool("run", "--no-traffic", "--data-dir", str(data), "--port", str(taken_port))
    assert out.returncode == 2, out.stderr
    assert (data / "leases.db").read_bytes() == b"the last run's ledger"


@pytest.mark.parametrize("option", ["--cluster", "--workloads"])
def test_run_with_a_bad_spec_file_keeps_the_last_runs_store(tmp_path: Path, option: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "leases.db").write_bytes(b"the last run's ledger")
    missing = tmp_path / "typo.yaml"
    out = gpupool("run", "--no-traffic", "--data-dir", str(data), "--port", "0", option, str(missing))
    assert out.returncode == 2, out.stderr
    assert f"{missing}: no such file" in out.stderr
    assert (data / "leases.db").read_bytes() == b"the last run's ledger"
    assert sorted(p.name for p in data.iterdir()) == ["leases.db"]  # not even a lock file


def test_emulate_backend_refuses_an_unknown_gpu() -> None:
    out = gpupool("emulate-backend", "--model", "qwen2.5-0.5b", "--gpu", "A100-80G", "--port", "0")
    assert out.returncode == 2, out.stderr
    assert "--gpu 'A100-80G': unknown GPU model (known: A100-SXM4-80GB" in out.stderr


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("ü☃", "expected HOST:PORT, ray://HOST:PORT, 'auto' or 'local'"),
        (" ", "expected HOST:PORT"),
        ("127.0.0.1", "expected HOST:PORT"),
        ("ray://127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:abc", "expected HOST:PORT"),
        ("127.0.0.1:70000", "port must be in [1, 65535]"),
    ],
)
def test_serve_refuses_a_ray_address_ray_cannot_parse_before_anything_is_created(
    tmp_path: Path, address: str, why: str
) -> None:
    """It was Ray's ``Invalid address format: ü☃`` (no option named), after the data directory,
    the store and the admin token had been created."""
    data = tmp_path / "data"
    out = gpupool("serve", "--port", "0", "--data-dir", str(data), "--ray-address", address)
    assert_one_line_exit_2(out, f"invalid --ray-address={address!r}: {why}")
    assert not data.exists()


def test_serve_refuses_a_ray_address_nothing_answers_on(tmp_path: Path) -> None:
    """It printed the gateway's banner, then waited minutes inside Ray's connect."""
    with socket.socket() as s:  # a port nothing listens on (bound, then closed)
        s.bind(("127.0.0.1", 0))
        free = int(s.getsockname()[1])
    data = tmp_path / "data"
    for address in (f"127.0.0.1:{free}", f"ray://127.0.0.1:{free}"):
        out = gpupool("serve", "--port", "0", "--data-dir", str(data), "--ray-address", address)
        assert_one_line_exit_2(out, f"invalid --ray-address={address!r}: cannot reach 127.0.0.1:{free}:")
        assert not data.exists()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (not Ray): a thread holds them open."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_serve_refuses_a_ray_address_that_answers_but_is_not_ray(tmp_path: Path, silent_port: int) -> None:
    """The TCP connect succeeded, so start-up went on into Ray's connect, which retried for many
    minutes after the data directory, the store and the admin token had been created."""
    data = tmp_path / "data"
    for address in (f"127.0.0.1:{silent_port}", f"ray://127.0.0.1:{silent_port}"):
        out = gpupool("serve", "--port", "0", "--data-dir", str(data), "--ray-address", address)
        assert_one_line_exit_2(
            out, f"invalid --ray-address={address!r}: 127.0.0.1:{silent_port} is not Ray: no gRPC answer"
        )
        assert not data.exists()


@pytest.fixture
def grpc_port() -> Iterator[int]:
    """A real gRPC server on loopback with no services at all: it passes the HTTP/2 check, and every
    call to it is UNIMPLEMENTED."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


@pytest.mark.slow
def test_serve_refuses_a_grpc_server_that_is_not_ray_within_the_connect_deadline(
    tmp_path: Path, grpc_port: int
) -> None:
    """It answered the HTTP/2 check, so start-up went on into Ray's connect, which retried without
    end (a warning line a second on standard error) and the command never exited. Now the connect
    has a deadline: one line naming the option, exit 2, the data directory never created."""
    pytest.importorskip("ray", reason="ray is not installed here (pip install 'gpupool[ray]')")
    from gpupool.cli.ray_address import CONNECT_TIMEOUT_S

    data = tmp_path / "data"
    address = f"127.0.0.1:{grpc_port}"
    out = gpupool("serve", "--ray-address", address, "--data-dir", str(data), "--port", "0")
    assert_one_line_exit_2(
        out,
        f"invalid --ray-address={address!r}: cannot connect to Ray: no Ray cluster answered within "
        f"{CONNECT_TIMEOUT_S:g} s",
    )
    assert not data.exists()


@pytest.fixture
def settings_port() -> Iterator[tuple[int, threading.Event]]:
    """A loopback port that answers like a gRPC server's first frame (an empty SETTINGS frame) and
    nothing else, and notes each connection: `gpupool serve`'s address check is the first to
    connect, and Ray's connect starts right after it. Ray itself dials this machine's network
    address, where nothing listens, and retries in native code."""
    seen = threading.Event()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                with conn:
                    conn.recv(64)
                    conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS, no payload
                    seen.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(srv.getsockname()[1]), seen
    finally:
        srv.close()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_ray_connects_stops_at_once(
    tmp_path: Path, settings_port: tuple[int, threading.Event], sig: signal.Signals
) -> None:
    """Ray's connect retries in native code, where Python's signal handlers do not run: Ctrl-C
    took effect only at the connect deadline (30 s). Now a signal stops the command at once: one
    line, exit 128 + the signal, nothing created. Sent 3 s after the address check, inside
    Ray's connect; answered well before the deadline (the old code answered at it, exit 2)."""
    pytest.importorskip("ray", reason="ray is not installed here (pip install 'gpupool[ray]')")
    port, checked = settings_port
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "gpupool.cli.main", "serve", "--port", "0", "--data-dir", str(data)]
    proc = subprocess.Popen(
        [*cmd, "--ray-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert checked.wait(60), "serve never checked the address"
        time.sleep(3)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)  # (the connect deadline is 30 s after it started)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupool: error: "), err
    assert "stopped while connecting to Ray" in lines[0] and f"127.0.0.1:{port}" in lines[0]
    assert not data.exists()


def test_serve_refuses_ray_address_auto_without_a_cluster_before_anything_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` found no cluster only in Ray's connect, after the data directory, the store and the
    admin token had been created."""
    pytest.importorskip("ray", reason="ray is not installed here (pip install 'gpupool[ray]')")
    from ray._private.services import find_gcs_addresses

    from tests.ray_cluster import LOCK

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))  # no "last cluster started here" file
    data = tmp_path / "data"
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # no Ray head of another test is running meanwhile
        if find_gcs_addresses():
            pytest.skip("a Ray cluster runs on this machine: 'auto' would find it")
        out = gpupool("serve", "--port", "0", "--data-dir", str(data), "--ray-address", "auto")
    assert_one_line_exit_2(out, "invalid --ray-address='auto': cannot connect to Ray: ")
    assert not data.exists()


def test_extender_with_its_port_in_use_opens_no_store(tmp_path: Path, taken_port: int) -> None:
    """The extender opened (created) its ``--store`` first and bound its port only after it."""
    from tests.unit.cli.test_cli_options import CLUSTER

    db = tmp_path / "extender.db"
    args = ("extender", "--no-kube", "--cluster", CLUSTER, "--store", f"sqlite:{db}")
    out = gpupool(*args, "--port", str(taken_port))
    assert_one_line_exit_2(out, f"--host/--port: cannot listen on 127.0.0.1:{taken_port}: ")
    assert not db.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_run_keeping_a_batch_queue_that_is_not_sqlite_is_one_line(tmp_path: Path) -> None:
    """It printed the error, then Python's ``coroutine ... was never awaited`` warnings for the
    services made before the batch queue was opened."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "batch.db").write_bytes(b"not a batch queue")
    out = gpupool(
        "run", "--no-traffic", "--no-agents", "--port", "0", "--data-dir", str(data), "--keep-state"
    )
    assert_one_line_exit_2(out, f"batch queue: open {data / 'batch.db'}: file is not a database")
    # the data dir as it was: no lease store, no admin token, and no ``leases.db.lock`` either (the
    # lock was taken before the batch queue opened; a lock file is never deleted, so it stayed)
    assert {p.name: p.read_bytes() for p in data.iterdir()} == {"batch.db": b"not a batch queue"}


def test_serve_with_a_batch_queue_that_is_not_sqlite_leaves_the_data_dir_unchanged(tmp_path: Path) -> None:
    """It opened the lease store and generated, stored and printed the admin token as "shown once"
    before it opened the batch queue and stopped: the next start then showed no token."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "batch.db").write_bytes(b"not a batch queue")
    out = gpupool("serve", "--port", "0", "--data-dir", str(data))
    assert_one_line_exit_2(out, f"batch queue: open {data / 'batch.db'}: file is not a database")
    assert "shown once" not in out.stdout
    assert {p.name: p.read_bytes() for p in data.iterdir()} == {"batch.db": b"not a batch queue"}
    # once the file is moved away, the next start generates the admin token and shows it once
    (data / "batch.db").unlink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    p = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "serve", "--port", str(port), "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(4)]  # recovered, gateway on, admin token, tidal
        for _ in range(600):  # serving: the start went through
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        assert (data / "batch.db").is_file()
    finally:
        p.terminate()
        p.wait(timeout=30)
    shown = [line for line in lines if "shown once" in line]
    assert len(shown) == 1 and shown[0].rstrip().endswith((data / "admin.token").read_text().strip())


@pytest.mark.parametrize("command", ["serve", "run"])
def test_a_start_refused_after_the_batch_queue_opened_leaves_no_batch_queue(
    tmp_path: Path, command: str
) -> None:
    """The batch queue opens first now: a lease store that cannot be opened after it removes the
    queue file this start created (and no admin token is left either)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "leases.db").write_bytes(b"not a lease store")
    args = ["--port", "0", "--data-dir", str(data)]
    out = gpupool(command, *args, *(["--no-traffic", "--keep-state"] if command == "run" else []))
    assert out.returncode == 2, out.stderr
    assert str(data / "leases.db") in out.stderr
    assert sorted(p.name for p in data.iterdir()) == ["leases.db", "leases.db.lock"]
