"""`gpupool serve` runs tidal and the batch queue; `gpupool batch submit|list|cancel` drive it.

Real processes: the gateway, the CLI calls and the job itself (a child process group of the
gateway holding a P2 lease). Also: a bad tidal setting stops `serve` before it starts (exit 2, the
setting named); the DAY reservation refuses a P2 lease beyond the P2 share over HTTP (429 + reason);
``/v1/pool`` shows the mode and the next switch; bad CLI input exits 2 with one line.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpupool.adapters.pause.procfs import proc_state
from gpupool.cli.serving import free_port

pytestmark = pytest.mark.slow
GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUPOOL, *args], check=False, capture_output=True, text=True, timeout=60)


def call(url: str, token: str, method: str = "GET", body: object = None) -> tuple[int, dict[str, object]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait(pred: object, what: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if callable(pred) and pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"not reached: {what}")


def test_bad_tidal_setting_stops_serve_before_it_starts(tmp_path: Path) -> None:
    cfg = tmp_path / "tidal.yaml"
    cfg.write_text("tidal:\n  day_reserved_fraction: 1.5\n")
    r = cli("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--tidal-config", str(cfg))
    assert r.returncode == 2 and "tidal.day_reserved_fraction" in r.stderr and "Traceback" not in r.stderr
    r = cli("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--timezone", "Nowhere/City")
    # the option as typed, not the setting it overrides (that is the file's name for it)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        'gpupool: error: invalid --timezone="Nowhere/City": unknown IANA time zone'
    ], r.stderr
    assert not (tmp_path / "d" / "leases.db").exists()  # nothing was opened


def test_serve_runs_batch_jobs_with_p2_leases_and_the_cli_drives_them(tmp_path: Path) -> None:
    data = tmp_path / "d"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [*GPUPOOL, "serve", "--port", str(port), "--data-dir", str(data), "--timezone", "UTC"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait((data / "admin.token").exists, "the admin token")
        token = (data / "admin.token").read_text().strip()

        def up() -> bool:
            try:
                return call(f"{url}/v1/pool", token)[0] == 200
            except OSError:
                return False

        wait(up, "the gateway serves")
        _, pool = call(f"{url}/v1/pool", token)
        tidal = pool["tidal"]
        assert isinstance(tidal, dict) and tidal["mode"] == "day" and tidal["timezone"] == "UTC"
        assert isinstance(tidal["next_switch"], dict) and tidal["next_switch"]["to"] == "night"

        base = ["--url", url, "--data-dir", str(data)]
        job = [sys.executable, "-c", "import time\nwhile True:\n    time.sleep(0.05)\n"]
        r = cli("batch", "submit", *base, "--vram-mib", "4096", "--id", "j1", "--checkpointable", "--", *job)
        assert r.returncode == 0 and r.stdout.strip() == "j1 queued", r.stderr

        def running() -> dict[str, object] | None:
            out = cli("batch", "list", *base, "--json")
            jobs = {j["id"]: j for j in json.loads(out.stdout)}
            return jobs["j1"] if jobs["j1"]["state"] == "running" else None

        wait(lambda: running() is not None, "j1 runs")
        j1 = running()
        assert j1 is not None
        status, lease = call(f"{url}/v1/leases/{j1['lease_id']}", token)
        assert status == 200 and lease["priority"] == -1 and lease["state"] == "active"

        # the DAY reservation over the lease API: far beyond 20 % of the pool
        status, body = call(
            f"{url}/v1/leases", token, "POST", {"priority": "P2", "vram_mib": 81920, "gpu_count": 2}
        )
        assert status == 429 and "DAY reservation" in str(body["error"])

        r = cli("batch", "submit", *base, "--vram-mib", "0", "--", "true")
        assert r.returncode == 2 and "vram_mib" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        for flag, value in (("--deadline-s", "nan"), ("--deadline-s", "inf")):
            r = cli("batch", "submit", *base, "--vram-mib", "10", flag, value, "--", "true")
            assert r.returncode == 2 and f"invalid {flag}=" in r.stderr, r.stderr
        r = cli("batch", "cancel", *base, "j1")
        assert r.returncode == 0 and r.stdout.strip() == "j1 cancelled"
        _, lease = call(f"{url}/v1/leases/{j1['lease_id']}", token)
        assert lease["state"] == "released"
        r = cli("batch", "cancel", *base, "j1")
        assert r.returncode == 2 and "409" in r.stderr
        r = cli("batch", "list", *base, "--state", "cancelled")
        assert r.returncode == 0 and r.stdout.startswith("j1\tcancelled")

        # a job left running when the gateway stops is stopped with it (and requeued)
        pidfile = tmp_path / "j2.pid"
        code = (
            f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
            "while True: time.sleep(0.05)\n"
        )
        r = cli(
            "batch", "submit", *base, "--vram-mib", "1024", "--id", "j2", "--", sys.executable, "-c", code
        )
        assert r.returncode == 0
        wait(lambda: pidfile.exists() and pidfile.read_text().strip() != "", "j2 runs")
        pid = int(pidfile.read_text())
        assert proc_state(pid) in ("R", "S")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    wait(lambda: proc_state(pid) in (None, "Z"), "j2's process ended with the gateway")
    import sqlite3

    db = sqlite3.connect(data / "batch.db")
    assert db.execute("SELECT state FROM batch_jobs WHERE id = 'j2'").fetchone()[0] == "queued"
    db.close()
