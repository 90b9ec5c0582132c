"""The bare-node MIG actuator over the real pynvml call sequence of `NvmlMigHardware`, answered by
a stand-in of libnvidia-ml's MIG calls backed by a simulated node (NVML's error codes), and the
catalogue-shape -> NVML profile mapping."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.adapters.nvml.nvml_mig_standin import NvmlMigStandin

from gpupool.adapters.nvml.mig import NvmlMigHardware, nvml_profile_constant
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.hardware.catalogue import gpu_model
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migactuate import NVML_ERROR_INSUFFICIENT_RESOURCES, NvmlMigActuator, NvmlMigError
from gpupool.hardware.spec import load_cluster_spec

SPEC = {"nodes": [{"name": "n1", "gpus": [{"model": "A100-SXM4-80GB", "count": 2}]}]}


@pytest.fixture
def lib(tmp_path: Path) -> NvmlMigStandin:
    sim = SimulatedCluster(load_cluster_spec(SPEC), vram_registry=tmp_path / "vram")
    sim.set_mig_mode("n1/0", True)
    return NvmlMigStandin(sim, "n1")


def test_profile_shapes_map_to_nvml_constants() -> None:
    a100 = gpu_model("A100-SXM4-80GB")
    assert nvml_profile_constant(a100, "3g.40gb") == ("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 3)
    assert nvml_profile_constant(a100, "1g.10gb+me") == ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 1)
    assert nvml_profile_constant(a100, "1g.20gb") == ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 1)
    with pytest.raises(NvmlMigError, match="9g"):
        nvml_profile_constant(a100, "9g.90gb")


def test_apply_through_pynvml_calls(lib: NvmlMigStandin) -> None:
    hw = NvmlMigHardware(lib=lib)
    act = NvmlMigActuator(hw)
    assert hw.mig_enabled(0) and not hw.mig_enabled(1)
    out = act.apply("n1", {0: [MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4)]})
    assert out.ok, out.detail
    assert "create_gi 0 9 @4+4" in lib.calls and "create_ci 0 gi5 profile2" in lib.calls
    assert act.current(0) == (MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4))
    out = act.apply(
        "n1", {0: [MigInstance("3g.40gb", 0), MigInstance("2g.20gb", 4), MigInstance("1g.10gb", 6)]}
    )
    assert out.ok, out.detail
    assert lib.calls.index("destroy_ci 0 gi5 ci0") < lib.calls.index("destroy_gi 0 gi5")
    assert "destroy_gi 0 gi1" not in lib.calls  # the kept instance
    got = {(g.profile, g.start, g.compute_instances) for g in hw.gpu_instances(0)}
    assert got == {("3g.40gb", 0, (0,)), ("2g.20gb", 4, (0,)), ("1g.10gb", 6, (0,))}


def test_nvml_errors_keep_their_codes_and_processes_block(lib: NvmlMigStandin, tmp_path: Path) -> None:
    hw = NvmlMigHardware(lib=lib)
    hw.create_gpu_instance(0, "4g.40gb", 0)
    with pytest.raises(NvmlMigError) as exc:
        hw.create_gpu_instance(0, "3g.40gb", 0)
    assert exc.value.code == NVML_ERROR_INSUFFICIENT_RESOURCES
    hw.create_compute_instance(0, 1)
    proc, _ = start_holder(tmp_path / "vram", "n1/0/mig-4g.40gb-0", 2048)
    try:
        assert hw.gpu_instances(0)[0].processes == (proc.pid,)
        out = NvmlMigActuator(hw).apply("n1", {0: [MigInstance("7g.80gb", 0)]})
        assert not out.ok and "NVML_ERROR_IN_USE" in out.detail
    finally:
        proc.kill()
        proc.wait()
