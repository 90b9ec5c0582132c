"""`gpupool plan --actuator ... [--apply]` as a user runs it (real subprocesses): the dry run shows
the MIG diff and changes nothing, ``--apply`` acts through the actuator, bad input exits 2 naming
the option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SPECS = ("-c", "examples/cluster-a100-l40s.yaml", "-w", "examples/workloads-agent-platform.yaml")


def gpupool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "plan", *SPECS, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)


def test_dry_run_shows_the_diff_and_does_not_act() -> None:
    out = gpupool("--actuator", "simulated")
    assert out.returncode == 0, out.stderr
    assert "node gpu-a: gpu 0: +3g.40gb@0 +3g.40gb@4" in out.stdout
    assert "dry run: nothing changed" in out.stdout and "applied" not in out.stdout


def test_apply_acts_through_the_actuator() -> None:
    out = gpupool("--actuator", "simulated", "--apply", "--node", "gpu-a")
    assert out.returncode == 0, out.stderr
    assert "node gpu-a: applied via simulated NVML: gpu 0 +3g.40gb@0; gpu 0 +3g.40gb@4" in out.stdout


def test_bad_input_exits_2() -> None:
    out = gpupool("--apply")
    assert out.returncode == 2 and "--apply" in out.stderr
    out = gpupool("--actuator", "simulated", "--node", "nope")
    assert out.returncode == 2 and "--node" in out.stderr and "'nope'" in out.stderr
    out = gpupool("--actuator", "nvml")
    assert out.returncode == 2 and "--node" in out.stderr


def test_options_that_need_an_actuator_and_absurd_host_ram_are_exit_2() -> None:
    """``--node`` / ``--kube-api`` without ``--actuator`` were silently ignored (a user meaning to
    act on one node got the whole plan printed), and ``--host-ram-gib 10**30`` printed a plan with a
    29-digit ``--kv-offloading-size``."""
    for args, flag in ((("--node", "gpu-a"), "--node"), (("--kube-api", "https://k:6443"), "--kube-api")):
        out = gpupool(*args)
        assert out.returncode == 2 and f"{flag} needs --actuator" in out.stderr, out.stderr
    out = gpupool("-f", "vllm", "--host-ram-gib", str(10**30))
    assert out.returncode == 2 and "--host-ram-gib" in out.stderr and not out.stdout


def _nvml_usable() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def test_an_actuator_this_machine_cannot_use_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """docs/ops/node-actuation.md's dry run `gpupool plan ... --actuator nvml --node gpu-a` on a host
    without the NVIDIA driver, and `--actuator mig-manager` without any Kubernetes credentials,
    ended in a Python traceback (exit 1); now one line naming --actuator and why, exit 2, as
    `gpupool agent --devices nvml` does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    env["HOME"] = str(tmp_path)
    out = gpupool("--actuator", "mig-manager", env=env)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "invalid --actuator=mig-manager: no Kubernetes API" in out.stderr
    if _nvml_usable():
        pytest.skip("NVML works on this machine: the nvml actuator is usable")
    out = gpupool("--actuator", "nvml", "--node", "gpu-a")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "invalid --actuator=nvml: not usable here" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
