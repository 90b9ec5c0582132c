"""GPU catalogue lookups and capability choice."""

import pytest

from gpupool.hardware.capability import GpuMode, NoCapabilityError, choose_mode, supported_modes
from gpupool.hardware.catalogue import GPU_MODELS, UnknownGpuModelError, gpu_model, model_from_nvml_name


def test_required_models_present():
    for name in [
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "A100-PCIE-80GB",
        "A30-24GB",
        "H100-SXM5-80GB",
        "H100-PCIE-80GB",
        "H100-NVL-94GB",
        "H200-141GB",
        "H20-96GB",
        "B200",
        "L40S-48GB",
        "L4-24GB",
        "RTX4090-24GB",
        "A10-24GB",
        "T4-16GB",
        "V100-16GB",
        "V100-32GB",
    ]:
        gpu_model(name)


def test_aliases_case_and_punctuation():
    assert gpu_model("a100-80gb").name == "A100-SXM4-80GB"
    assert gpu_model("l40s").name == "L40S-48GB"
    assert gpu_model("H200 SXM5 141GB").name == "H200-141GB"


def test_unknown_model_lists_known():
    with pytest.raises(UnknownGpuModelError, match=r"unknown GPU model 'A100-FOO'.*A100-SXM4-80GB"):
        gpu_model("A100-FOO")


def test_capabilities():
    assert gpu_model("A100-SXM4-80GB").mig_capable
    assert not gpu_model("L40S-48GB").mig_capable
    assert all(m.mps_capable for m in GPU_MODELS)  # Volta and newer
    assert gpu_model("T4-16GB").compute_capability == (7, 5)


@pytest.mark.parametrize(
    ("nvml", "mib", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-SXM4-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-PCIE-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-SXM4-40GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM5-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIE-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-NVL-94GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA H20", 97871, "H20-96GB"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA L4", 23034, "L4-24GB"),
        ("NVIDIA A10", 23028, "A10-24GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
        ("NVIDIA B200", 183359, "B200-180GB"),
    ],
)
def test_nvml_names(nvml, mib, expected):
    m = model_from_nvml_name(nvml, total_mib=mib)
    assert m is not None and m.name == expected


def test_unknown_nvml_name():
    assert model_from_nvml_name("Quadro K620") is None


def test_choose_mode():
    assert choose_mode("A100-SXM4-80GB", wants_hard_isolation=True).mode is GpuMode.MIG
    assert choose_mode("A100-SXM4-80GB", wants_hard_isolation=False).mode is GpuMode.MPS
    c = choose_mode("L40S-48GB", wants_hard_isolation=True)
    assert c.mode is GpuMode.MPS and "no MIG" in c.reason
    assert supported_modes("L4-24GB")[0] is GpuMode.MPS
    assert supported_modes("H100-SXM5-80GB")[:2] == (GpuMode.MIG, GpuMode.MPS)


def test_time_slice_only_as_flagged_last_resort():
    from gpupool.hardware.catalogue import Arch, GpuModel

    old = GpuModel("P100-16GB", 16280, 56, Arch.VOLTA, (6, 0))
    with pytest.raises(NoCapabilityError):
        choose_mode(old, wants_hard_isolation=False)
    c = choose_mode(old, wants_hard_isolation=False, allow_time_slicing=True)
    assert c.mode is GpuMode.TIME_SLICE and c.flagged and "no memory isolation" in c.reason
