"""The assembled agent on the real clock: loop thread + reporter + /metrics over HTTP, and the CLI as a
real subprocess against the stand-in gateway. Waits are liveness bounds, not timing assertions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from gpupool.agent.loop import AgentConfig
from gpupool.agent.runtime import build_runtime
from gpupool.agent.source import GpuSample, ScriptedSource
from gpupool.core.pausers import Workload
from tests.agent.agent_helpers import running, stopped, wait_for
from tests.agent.standin_gateway import StandinGateway, lease_out

REPO = Path(__file__).resolve().parents[2]


def mig_node() -> ScriptedSource:
    inst = (
        GpuSample(
            "n1/1/mig-3g.40gb-1",
            1,
            1000,
            40960,
            uuid="MIG-aaaa",
            model="A100-SXM4-80GB",
            mig_profile="3g.40gb",
            gi_id=1,
            engine_active_ratio=0.25,
        ),
    )
    return ScriptedSource(
        [
            GpuSample(
                "n1/0",
                0,
                1000,
                10000,
                uuid="GPU-0000",
                model="H100-SXM5-80GB",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id="00000000:18:00.0",
                temperature_c=41,
                util_pct=30,
                power_mw=123_500,
            ),
            GpuSample(
                "n1/1",
                1,
                1000,
                81920,
                uuid="GPU-1111",
                model="A100-SXM4-80GB",
                name="NVIDIA A100-SXM4-80GB",
                pci_bus_id="00000000:19:00.0",
                temperature_c=39,
                power_mw=90_000,
                instances=inst,
            ),
        ]
    )


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]


def test_runtime_pauses_reports_and_serves_dcgm_metrics(batch_job: subprocess.Popen[bytes]) -> None:
    gw = StandinGateway()
    gw.start()
    source = mig_node()
    rt = build_runtime(
        node="n1", gateway=gw.url, token="t0ken", config=AgentConfig("n1", period_s=0.05), source=source
    )
    rt.agent.register(Workload("p2", "n1/0", "signal", vram_mib=500, pgid=batch_job.pid))
    rt.start(metrics_port=0)
    try:
        source.set_used_ratio("n1/0", 0.95)
        assert wait_for(lambda: stopped(batch_job.pid))
        assert wait_for(lambda: any(e["kind"] == "paused" for e in gw.events()))
        source.inject_xid("n1/1", 48)
        assert wait_for(lambda: any(e["kind"] == "unhealthy" for e in gw.events()))
        text = httpx.get(f"http://127.0.0.1:{rt.metrics_port}/metrics", timeout=5).text
        used = series(text, "DCGM_FI_DEV_FB_USED")
        assert any(
            'gpu="0"' in s
            and 'UUID="GPU-0000"' in s
            and 'hostname="n1"' in s
            and 'modelName="NVIDIA H100 80GB HBM3"' in s  # NVML's name, as dcgm-exporter's modelName
            and 'pci_bus_id="00000000:18:00.0"' in s
            and s.endswith(" 9500.0")
            for s in used
        ), used
        mig = [s for s in used if "GPU_I_PROFILE" in s]
        assert (
            len(mig) == 1
            and 'GPU_I_PROFILE="3g.40gb"' in mig[0]
            and 'GPU_I_ID="1"' in mig[0]
            and 'UUID="GPU-1111"' in mig[0]  # dcgm-exporter: the parent GPU's UUID, told apart by GPU_I_ID
            and 'pci_bus_id="00000000:19:00.0"' in mig[0]
            and "MIG-aaaa" not in mig[0]
        )
        assert any(s.endswith(" 500.0") and 'gpu="0"' in s for s in series(text, "DCGM_FI_DEV_FB_FREE"))
        util = series(text, "DCGM_FI_DEV_GPU_UTIL")
        assert len(util) == 1 and 'gpu="0"' in util[0]  # never exported for MIG instances or when unknown
        assert any(
            'GPU_I_ID="1"' in s and s.endswith(" 0.25") for s in series(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        )
        assert any('gpu="0"' in s and s.endswith(" 123.5") for s in series(text, "DCGM_FI_DEV_POWER_USAGE"))
        assert any('gpu="0"' in s and s.endswith(" 41.0") for s in series(text, "DCGM_FI_DEV_GPU_TEMP"))
        assert any(
            'UUID="GPU-1111"' in s
            and 'err_code="48"' in s
            and 'err_msg="Double Bit ECC Error"' in s
            and s.endswith(" 48.0")
            for s in series(text, "DCGM_FI_DEV_XID_ERRORS")
        )
        # a GPU that raised no XID reads 0, as dcgm-exporter's does (not absent until the first XID)
        assert any(
            'UUID="GPU-0000"' in s and 'err_code="0"' in s and "err_msg" not in s and s.endswith(" 0.0")
            for s in series(text, "DCGM_FI_DEV_XID_ERRORS")
        )
        assert any(
            'gpu="0"' in s and s.endswith(" 1.0") for s in series(text, "gpupool_agent_watermark_paused")
        )
        assert any(
            'UUID="GPU-1111"' in s and s.endswith(" 0.0") for s in series(text, "gpupool_agent_gpu_healthy")
        )
        assert any(
            'pauser="signal"' in s and 'action="pause"' in s and s.endswith(" 1.0")
            for s in series(text, "gpupool_agent_pauses_total")
        )
        assert series(text, "gpupool_agent_pause_latency_seconds_count")
        assert any(s.endswith(" 1.0") for s in series(text, "gpupool_agent_watermark_transitions_total"))
        assert series(text, "gpupool_agent_gateway_connected")
        avail = series(text, "gpupool_agent_pauser_available")
        assert any('pauser="signal"' in x and x.endswith(" 1.0") for x in avail)
        assert any('pauser="cuda-checkpoint"' in x for x in avail)  # detected, 0 or 1 by machine
        source.set_used_ratio("n1/0", 0.10)
        assert wait_for(lambda: running(batch_job.pid))
    finally:
        rt.stop()
        gw.stop()
    rt.stop()  # idempotent


def test_cli_agent_subprocess_reports_to_the_gateway() -> None:
    gw = StandinGateway()
    gw.start()
    env = dict(os.environ, GPUPOOL_AGENT_TOKEN="t0ken", PYTHONPATH=str(REPO / "src"))
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpupool.cli.main",
                "agent",
                "--node",
                "n7",
                "--devices",
                "scripted",
                "--gpus",
                "3",
                "--gateway",
                gw.url,
                "--metrics-port",
                "-1",
                "--period-ms",
                "50",
                "--duration-s",
                "2.5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert gw.readings
        assert [g["gpu_id"] for g in gw.readings[-1]["gpus"]] == ["n7/0", "n7/1", "n7/2"]
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpupool.cli.main",
                "agent",
                "--node",
                "n7",
                "--gateway",
                gw.url,
                "--token",
                "",
                "--metrics-port",
                "-1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(env, GPUPOOL_AGENT_TOKEN=""),
            check=False,
        )
        assert bad.returncode == 2 and "token" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpupool.cli.main",
                "agent",
                "--node",
                "n7",
                "--devices",
                "quantum",
                "--metrics-port",
                "-1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert bad.returncode == 2 and "devices" in bad.stderr
    finally:
        gw.stop()


def test_cli_agent_logs_gateway_outages_and_failures_once(tmp_path: Path) -> None:
    """The agent's log (stderr) names what an operator must act on: a gateway that refuses its token,
    and a workload the agent cannot act on, each once, not at the tick or ledger rate."""
    gw = StandinGateway()
    gw.start()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    cmd = [sys.executable, "-m", "gpupool.cli.main", "agent", "--node", "n1", "--gateway", gw.url]
    cmd += ["--metrics-port", "-1", "--no-publish", "--duration-s", "3"]
    try:
        bad = subprocess.run(
            [*cmd, "--token", "wrong-token"], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        assert bad.returncode == 0, bad.stderr
        refused = [line for line in bad.stderr.splitlines() if "HTTP 401" in line]
        assert len(refused) == 1 and gw.url in refused[0], bad.stderr
        gw.leases = [
            lease_out(
                "bad-pids",
                node="n1",
                gpu_id="n1/0",
                priority=-1,
                vram_mib=100,
                labels={"gpupool.io/pauser": "signal", "gpupool.io/pids": "12,abc"},
            )
        ]
        ok = subprocess.run(
            [*cmd, "--token", "t0ken"], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        assert ok.returncode == 0, ok.stderr
        assert gw.gets.count("/v1/leases") >= 2  # the same bad lease was seen more than once
        failures = [line for line in ok.stderr.splitlines() if line.startswith("pauser_failure")]
        assert len(failures) == 1, ok.stderr
        assert "lease bad-pids" in failures[0] and 'gpupool.io/pids="12,abc"' in failures[0]
    finally:
        gw.stop()
