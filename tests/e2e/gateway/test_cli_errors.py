"""Bad input to `gpupool serve` / `gpupool emulate-backend`: exit code 2 with one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
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
