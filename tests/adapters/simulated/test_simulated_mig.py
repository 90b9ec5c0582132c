"""NVML's MIG calls on simulated GPUs (semantics and error codes as NVML documents them) and the
bare-node actuator driving them: drain first, minimal change, ledger-visible slices only after the
hardware changed. Real holder processes stand for CUDA processes on an instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migactuate import (
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlMigActuator,
    NvmlMigError,
)
from gpupool.hardware.spec import load_cluster_spec

SPEC = {"nodes": [{"name": "n1", "gpus": [{"model": "A100-SXM4-80GB", "count": 2}]}]}


@pytest.fixture
def sim(tmp_path: Path) -> SimulatedCluster:
    c = SimulatedCluster(load_cluster_spec(SPEC), vram_registry=tmp_path / "vram")
    c.set_mig_mode("n1/0", True)
    return c


def codes(fn: object) -> int:
    with pytest.raises(NvmlMigError) as exc:
        fn()  # type: ignore[operator]
    return exc.value.code


def test_nvml_error_codes(sim: SimulatedCluster) -> None:
    hw = sim.mig_hardware("n1")
    assert codes(lambda: hw.create_gpu_instance(1, "3g.40gb", 0)) == NVML_ERROR_NOT_SUPPORTED  # MIG off
    assert codes(lambda: hw.create_gpu_instance(0, "3g.40gb", 2)) == NVML_ERROR_INVALID_ARGUMENT  # bad start
    assert codes(lambda: hw.create_gpu_instance(0, "9g.90gb", 0)) == NVML_ERROR_INVALID_ARGUMENT  # no profile
    gi = hw.create_gpu_instance(0, "4g.40gb", 0)
    assert (
        codes(lambda: hw.create_gpu_instance(0, "3g.40gb", 0)) == NVML_ERROR_INSUFFICIENT_RESOURCES
    )  # overlap
    hw.create_gpu_instance(0, "3g.40gb", 4)
    assert (
        codes(lambda: hw.create_gpu_instance(0, "1g.10gb", 6)) == NVML_ERROR_INSUFFICIENT_RESOURCES
    )  # 7 SMs used
    hw.create_compute_instance(0, gi)
    assert codes(lambda: hw.create_compute_instance(0, gi)) == NVML_ERROR_INSUFFICIENT_RESOURCES
    assert codes(lambda: hw.destroy_gpu_instance(0, gi)) == NVML_ERROR_IN_USE  # compute instance left
    hw.destroy_compute_instance(0, gi, 0)
    hw.destroy_gpu_instance(0, gi)
    assert [(g.profile, g.start) for g in hw.gpu_instances(0)] == [("3g.40gb", 4)]


def test_a_process_on_an_instance_blocks_its_destruction(sim: SimulatedCluster, tmp_path: Path) -> None:
    hw = sim.mig_hardware("n1")
    gi = hw.create_gpu_instance(0, "3g.40gb", 0)
    hw.create_compute_instance(0, gi)
    proc, _ = start_holder(tmp_path / "vram", "n1/0/mig-3g.40gb-0", 1000)
    try:
        (g,) = hw.gpu_instances(0)
        assert g.processes == (proc.pid,)
        assert codes(lambda: hw.destroy_compute_instance(0, gi, 0)) == NVML_ERROR_IN_USE
        act = NvmlMigActuator(hw)
        out = act.apply("n1", {0: [MigInstance("7g.80gb", 0)]})
        assert not out.ok and "NVML_ERROR_IN_USE" in out.detail
        assert act.current(0) == (MigInstance("3g.40gb", 0),)  # untouched
    finally:
        proc.kill()
        proc.wait()
    assert NvmlMigActuator(hw).apply("n1", {0: [MigInstance("7g.80gb", 0)]}).ok


def test_actuator_applies_the_difference_and_the_slices_follow(sim: SimulatedCluster) -> None:
    hw = sim.mig_hardware("n1")
    act = NvmlMigActuator(hw)
    first = [MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4)]
    out = act.apply("n1", {0: first})
    assert out.ok and [c.create for c in out.changes] == [tuple(first)]
    second = [MigInstance("3g.40gb", 0), MigInstance("2g.20gb", 4), MigInstance("1g.10gb", 6)]
    out = act.apply("n1", {0: second})
    assert out.ok
    (c,) = out.changes
    assert c.destroy == (MigInstance("3g.40gb", 4),)  # the 3g at 0 is kept
    assert set(c.create) == {MigInstance("2g.20gb", 4), MigInstance("1g.10gb", 6)}
    reading = sim.read("n1").gpu(0)
    assert reading.mig_enabled
    assert sorted((d.profile, d.start) for d in reading.mig_devices) == [
        ("1g.10gb", 6),
        ("2g.20gb", 4),
        ("3g.40gb", 0),
    ]
    ids = {s.id for s in sim.inventory() if s.gpu_id == "n1/0"}
    assert ids == {"n1/0/mig-3g.40gb-0", "n1/0/mig-2g.20gb-4", "n1/0/mig-1g.10gb-6"}


def test_drain_first_nothing_changes_while_leases_remain(sim: SimulatedCluster) -> None:
    hw = sim.mig_hardware("n1")
    NvmlMigActuator(hw).apply("n1", {0: [MigInstance("7g.80gb", 0)]})
    asked: list[tuple[str, int, tuple[MigInstance, ...]]] = []

    def busy(node: str, index: int, doomed: object) -> list[str]:
        asked.append((node, index, tuple(doomed)))  # type: ignore[arg-type]
        return ["lease-7"]

    out = NvmlMigActuator(hw, busy=busy).apply("n1", {0: [MigInstance("1g.10gb", 0)]})
    assert not out.ok and out.busy == ("lease-7",) and "drain first" in out.detail
    assert asked == [("n1", 0, (MigInstance("7g.80gb", 0),))]
    assert [(g.profile, g.start) for g in hw.gpu_instances(0)] == [("7g.80gb", 0)]


def test_mig_mode_off_is_refused_and_never_toggled(sim: SimulatedCluster) -> None:
    out = NvmlMigActuator(sim.mig_hardware("n1")).apply("n1", {1: [MigInstance("7g.80gb", 0)]})
    assert not out.ok and "MIG mode is off" in out.detail
    assert not sim.read("n1").gpu(1).mig_enabled
