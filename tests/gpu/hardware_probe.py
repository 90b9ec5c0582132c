"""Probe a machine with a real NVIDIA GPU and write what it saw, for the fixtures and the notes.

Run on a GPU node (root, driver loaded, ``nvidia-ml-py`` importable; PyTorch for the CUDA clients)::

    PYTHONPATH=src python3 tests/gpu/hardware_probe.py OUT_DIR

It never changes the GPU's modes (MIG, compute mode, clocks, power); it starts its own MPS control
daemon with a private pipe and log directory and quits it at the end. What it writes to OUT_DIR:

- ``nvml-idle.json`` / ``nvml-busy.json`` / ``nvml-mps.json``: ``gpupool.adapters.nvml.record`` readings
  (the fixture format ``FakeNvml`` replays) with the GPU idle, with one CUDA process holding memory,
  and with MPS clients running;
- ``probe.json``: NVML read cost through ``NvmlDeviceSource`` (the agent's 200 ms loop), the MIG
  GPU-instance profile table the driver reports, the MPS control transcript (each command line and
  the daemon's exact reply), what MPS clients with a pinned-memory cap and a thread percentage could
  allocate and compute, and the timeline of a standalone ``gpupool agent --devices nvml`` pausing and
  then revoking a P2 process whose VRAM crossed the 88 % watermark.

Each part records its own error and the probe goes on, so one unsupported feature costs one field.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB

CLIENT = r"""
import json, os, sys, time
import torch
want_gib = float(sys.argv[1]); compute_s = float(sys.argv[2]); hold_s = float(sys.argv[3])
out = {"pid": os.getpid(), "env_mem": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""),
       "env_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")}
t0 = time.monotonic()
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
out["context_s"] = round(time.monotonic() - t0, 3)
held, got = [], 0.0
try:
    while got + 0.5 <= want_gib:
        held.append(torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")); got += 0.5
except Exception as exc:
    out["alloc_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
out["allocated_gib"] = got
if compute_s > 0:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); n = 0; t = time.monotonic()
    while time.monotonic() - t < compute_s:
        for _ in range(20): a @ b
        n += 20
    torch.cuda.synchronize(); dt = time.monotonic() - t
    out["tflops"] = round(n * 2 * 4096**3 / dt / 1e12, 1)
print(json.dumps(out), flush=True)
time.sleep(hold_s)
"""

GROWER = r"""
import os, sys, time
import torch
target = float(sys.argv[1]); step = float(sys.argv[2])
torch.zeros(1, device="cuda"); held = []; got = 0.0
while got + step <= target:
    held.append(torch.empty(int(step * 1024**3), dtype=torch.uint8, device="cuda")); got += step
    print(f"held {got:.1f} GiB", flush=True); time.sleep(0.25)
while True:
    time.sleep(1)
"""


def part(report: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    t0 = time.monotonic()
    try:
        report[name] = fn()
    except Exception as exc:
        report[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    print(f"[probe] {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)


def write_recording(out: Path, name: str, description: str) -> dict[str, Any]:
    from gpupool.adapters.nvml.record import record

    doc = record(description=description)
    (out / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    d0 = doc["devices"][0] if doc["devices"] else {}
    return {
        "file": name,
        "gpus": len(doc["devices"]),
        "memory": d0.get("memory"),
        "procs": d0.get("processes"),
    }


def read_cost() -> dict[str, Any]:
    from gpupool.adapters.nvml.source import NvmlDeviceSource

    src = NvmlDeviceSource("probe")
    try:
        first = src.read()
        times = []
        for _ in range(200):
            t = time.perf_counter()
            src.read()
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        g = first.gpus[0]
        return {
            "reads": len(times),
            "read_ms": {"p50": round(times[100], 3), "p99": round(times[197], 3), "max": round(times[-1], 3)},
            "gpu": {
                k: getattr(g, k, None)
                for k in (
                    "name",
                    "memory_total_mib",
                    "memory_used_mib",
                    "memory_reserved_mib",
                    "temperature_c",
                    "utilization_pct",
                    "mig_enabled",
                    "healthy",
                    "error",
                )
            },
        }
    finally:
        src.close()


def mig_profiles() -> dict[str, Any]:
    import pynvml as nv

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        out: dict[str, Any] = {"name": str(nv.nvmlDeviceGetName(h))}
        try:
            out["mig_mode"] = list(nv.nvmlDeviceGetMigMode(h))
        except nv.NVMLError as exc:
            out["mig_mode"] = f"error {exc}"
        rows = []
        for p in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 16))):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
            except nv.NVMLError as exc:
                rows.append({"profile": p, "error": str(exc)})
                continue
            row = {"profile": p}
            for f in (
                "id",
                "sliceCount",
                "instanceCount",
                "multiprocessorCount",
                "copyEngineCount",
                "decoderCount",
                "encoderCount",
                "jpegCount",
                "ofaCount",
                "memorySizeMB",
                "isP2pSupported",
            ):
                if hasattr(info, f):
                    row[f] = int(getattr(info, f))
            try:
                v = nv.nvmlDeviceGetGpuInstanceProfileInfoV(h, p)
                row["name"] = v.name.decode() if isinstance(v.name, bytes) else str(v.name)
            except Exception as exc:
                row["name_error"] = str(exc)
            rows.append(row)
        out["profiles"] = rows
        return out
    finally:
        nv.nvmlShutdown()


def _client(env: dict[str, str], want_gib: float, compute_s: float, hold_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(want_gib), str(compute_s), str(hold_s)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    """The client's one JSON line, or what it printed if it died or said nothing within ``timeout``."""
    ready, _, _ = select.select([p.stdout], [], [], timeout) if p.stdout else ([], [], [])
    line = p.stdout.readline() if ready and p.stdout else ""
    if not line and p.poll() is None:
        p.kill()
    try:
        return json.loads(line) | {"rc": p.poll()}
    except json.JSONDecodeError:
        p.wait(timeout)
        return {"rc": p.returncode, "stdout": line, "stderr": (p.stderr.read() if p.stderr else "")[-1500:]}


def mps(out: Path) -> dict[str, Any]:
    from gpupool.adapters.mps.control import BinaryTransport, MpsControl, MpsLimits, client_env

    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        return {"error": "nvidia-cuda-mps-control not on PATH"}
    pipe = tempfile.mkdtemp(prefix="mps-pipe-")
    logs = tempfile.mkdtemp(prefix="mps-log-")
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    res: dict[str, Any] = {"binary": binary}
    start = subprocess.run(
        [binary, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False
    )
    res["start"] = {"rc": start.returncode, "stdout": start.stdout, "stderr": start.stderr}
    raw = BinaryTransport(pipe)
    ctl = MpsControl(pipe)
    transcript: list[dict[str, str]] = []

    def say(line: str) -> str:
        try:
            reply = raw.send(line)
        except Exception as exc:
            reply = f"<transport error: {exc}>"
        transcript.append({"command": line, "reply": reply})
        return reply

    try:
        time.sleep(0.5)
        say("get_server_list")
        say("set_default_active_thread_percentage 50")
        say("get_default_active_thread_percentage")
        say("set_default_device_pinned_mem_limit 0 4096M")
        say("get_default_device_pinned_mem_limit 0")
        say("no_such_command")
        say("get_active_thread_percentage 999999")
        # a client under the server's defaults (4096M, 50 %) that wants 6 GiB and computes 3 s
        c_default = _client(env, 6, 3, 25)
        res["client_defaults"] = _result(c_default)
        servers = say("get_server_list")
        pid = int(servers.split()[0]) if servers.split() and servers.split()[0].isdigit() else 0
        if pid:
            say(f"get_active_thread_percentage {pid}")
            say(f"get_device_pinned_mem_limit {pid} 0")
            lines = ctl.apply(MpsLimits(8192, 30), device=0, server_pid=pid)
            res["applied_lines"] = list(lines)
            say(f"get_active_thread_percentage {pid}")
            say(f"get_device_pinned_mem_limit {pid} 0")
        # clients created after apply(): server limits 8192M / 30 %, one lowering its own cap to 2 GiB
        lim = client_env(pipe, 0, MpsLimits(2048, 100))
        c_capped = _client(lim, 4, 0, 20)
        res["client_capped_2g"] = _result(c_capped)
        c_after = _client(env, 12, 3, 20)
        res["client_after_apply"] = _result(c_after)
        c_full = _client({**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, 1, 3, 15)
        res["client_pct100_env"] = _result(c_full)
        part(res, "recording", lambda: write_recording(out, "nvml-mps.json", "H200, MPS daemon + clients"))
        res["first_client_alive_after_others_oom"] = c_default.poll() is None
        for p in (c_default, c_capped, c_after, c_full):
            p.kill()
            p.wait(30)
    finally:
        say("quit")
        time.sleep(1)
        res["transcript"] = transcript
        for f in sorted(Path(logs).glob("*")):
            res.setdefault("logs", {})[f.name] = f.read_text(errors="replace")[-3000:]
    return res


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def watermark_loop(out: Path) -> dict[str, Any]:
    """A standalone agent on real NVML; a P2 process grows past 88 % VRAM; the agent must SIGSTOP it,
    then revoke (kill) it because stopping frees no VRAM; NVML must see the memory come back."""
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    total = nv.nvmlDeviceGetMemoryInfo(h).total
    target_gib = 0.93 * total / GIB
    grower = subprocess.Popen(
        [sys.executable, "-c", GROWER, f"{target_gib:.1f}", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "agent",
            "--node",
            "probe",
            "--devices",
            "nvml",
            "--workload",
            f"lease=batch-1,gpu=probe/0,pauser=signal,pgid={grower.pid}",
            "--revoke-after-s",
            "4",
            "--metrics-port",
            "19400",
            "--duration-s",
            "60",
            "--evict-grace-ms",
            "500",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    t0 = time.monotonic()
    timeline: list[dict[str, Any]] = []
    last = None
    marks: dict[str, float] = {}
    try:
        while time.monotonic() - t0 < 50:
            used = nv.nvmlDeviceGetMemoryInfo(h).used
            state = _proc_state(grower.pid)
            ratio = used / total
            t = round(time.monotonic() - t0, 3)
            if ratio >= 0.88 and "crossed_88" not in marks:
                marks["crossed_88"] = t
            if state == "T" and "stopped" not in marks:
                marks["stopped"] = t
            if state in ("Z", "gone") and "exited" not in marks:
                marks["exited"] = t
            if "exited" in marks and ratio <= 0.70 and "freed_below_70" not in marks:
                marks["freed_below_70"] = t
            if (state, round(ratio, 2)) != last:
                timeline.append({"t_s": t, "state": state, "vram_ratio": round(ratio, 4)})
                last = (state, round(ratio, 2))
            if "freed_below_70" in marks and time.monotonic() - t0 > marks["freed_below_70"] + 1:
                break
            if state == "Z":
                grower.poll()
            time.sleep(0.05)
        metrics = ""
        try:
            with urllib.request.urlopen("http://127.0.0.1:19400/metrics", timeout=5) as r:
                metrics = r.read().decode()
        except Exception as exc:
            metrics = f"<metrics error: {exc}>"
        (out / "agent-metrics.txt").write_text(metrics)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent_out = agent.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            agent.kill()
            agent_out = agent.communicate()[0]
        if grower.poll() is None:
            os.killpg(grower.pid, signal.SIGKILL)
        grower_out = grower.communicate(timeout=20)[0]
        nv.nvmlShutdown()
    return {
        "total_mib": total // MIB,
        "target_gib": round(target_gib, 1),
        "marks_s": marks,
        "timeline": timeline[:200],
        "grower_returncode": grower.returncode,
        "grower_output": grower_out[-1500:],
        "agent_output": agent_out[-4000:],
        "metrics_lines": [ln for ln in metrics.splitlines() if ln.startswith("gpupool_agent_")][:80],
    }


def busy(out: Path) -> dict[str, Any]:
    p = _client({}, 20, 0, 30)
    try:
        r = _result(p)
        time.sleep(1)
        return {
            "client": r,
            "recording": write_recording(out, "nvml-busy.json", "H200, one CUDA process holding 20 GiB"),
        }
    finally:
        p.kill()
        p.wait(30)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    part(
        report,
        "nvidia_smi",
        lambda: (
            subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30, check=False).stdout
        ),
    )
    part(
        report, "idle", lambda: write_recording(out, "nvml-idle.json", "1 x NVIDIA H200, idle, MIG disabled")
    )
    part(report, "read_cost", read_cost)
    part(report, "mig_profiles", mig_profiles)
    part(report, "busy", lambda: busy(out))
    part(report, "mps", lambda: mps(out))
    part(report, "watermark_loop", lambda: watermark_loop(out))
    part(
        report,
        "doctor",
        lambda: (
            subprocess.run(
                [sys.executable, "-m", "gpupool.cli.main", "doctor", "--json", "--node", "probe"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            ).stdout
        ),
    )
    (out / "probe.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    print(json.dumps({k: (v if k != "nvidia_smi" else "...") for k, v in report.items()}, default=str)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
