"""The ``vllm serve`` arguments the planner emits (`hardware/vllmargs.py`, `gpupool plan --format vllm`):
memory share per slice kind, prefix caching for decoders only, the KV host tier sized from the node's
RAM over its decoder instances, and bad input named."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from gpupool.hardware.slices import SliceKind
from gpupool.hardware.vllmargs import host_tier_gib, vllm_args

SPECS = ("-c", "examples/cluster-a100-l40s.yaml", "-w", "examples/workloads-agent-platform.yaml")


def test_a_decoder_on_a_mig_slice_gets_prefix_caching_and_the_host_tier() -> None:
    args = vllm_args(
        model="qwen2.5-14b",
        kind=SliceKind.MIG,
        slice_vram_mib=40192,
        gpu_memory_mib=81920,
        max_context=32768,
        offload_gib=48,
    )
    assert args[:3] == ["vllm", "serve", "qwen2.5-14b"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.9"  # the MIG instance is its device
    assert args[args.index("--max-model-len") + 1] == "32768"
    assert "--enable-prefix-caching" in args
    i = args.index("--kv-offloading-backend")
    assert args[i : i + 4] == ["--kv-offloading-backend", "native", "--kv-offloading-size", "48"]
    lm = vllm_args(
        model="m", kind=SliceKind.WHOLE, slice_vram_mib=1, gpu_memory_mib=1, max_context=1,
        offload_backend="lmcache", offload_gib=8,
    )  # fmt: skip
    assert lm[lm.index("--kv-offloading-backend") + 1] == "lmcache"


def test_an_mps_share_takes_its_share_of_the_card_and_encoders_get_no_kv_flags() -> None:
    args = vllm_args(
        model="bge-m3", kind=SliceKind.MPS, slice_vram_mib=4096, gpu_memory_mib=46068,
        max_context=512, decoder=False, offload_gib=32,
    )  # fmt: skip
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.089"
    assert "--enable-prefix-caching" not in args and "--kv-offloading-backend" not in args
    no_tier = vllm_args(model="m", kind=SliceKind.WHOLE, slice_vram_mib=1, gpu_memory_mib=1, max_context=1)
    assert "--kv-offloading-size" not in no_tier  # 0 GiB: no host tier flags at all


def test_host_tier_sizing_and_bad_values() -> None:
    assert host_tier_gib(512, 4) == 64  # half the RAM over four instances
    assert host_tier_gib(512, 4, 25) == 32
    assert host_tier_gib(3, 4) == 0
    with pytest.raises(ValueError, match="instances=0"):
        host_tier_gib(512, 0)
    with pytest.raises(ValueError, match="offload_backend"):
        vllm_args(model="m", kind=SliceKind.WHOLE, slice_vram_mib=1, gpu_memory_mib=1, max_context=1,
                  offload_backend="disk")  # fmt: skip


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "plan", *SPECS, "--format", "vllm", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_plan_format_vllm_prints_a_command_per_model_instance() -> None:
    out = _plan("--host-ram-gib", "512")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    cmds = [shlex.split(x) for x in lines if x.startswith("vllm serve")]
    assert cmds and len(cmds) == sum(1 for x in lines if x.startswith("# "))
    decoders = [c for c in cmds if "--enable-prefix-caching" in c]
    assert decoders and all("--kv-offloading-size" in c for c in decoders)
    assert all("--kv-offloading-size" not in c for c in cmds if c not in decoders)
    bad = _plan("--kv-offload", "disk")
    assert bad.returncode == 2 and "--kv-offload" in bad.stderr
    bad = _plan("--host-ram-gib", "-1")
    assert bad.returncode == 2 and "--host-ram-gib" in bad.stderr
