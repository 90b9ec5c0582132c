"""GPU model catalogue: memory, SMs, architecture, compute capability, MIG and MPS capability.

Role: the planning-time facts about every GPU model gpupool knows (NVIDIA's datasheets and the MIG
and MPS user guides).
Real devices are always read through NVML; these numbers are for planning, tests and the simulator.

Public API:
- ``GpuModel``: frozen value (``name``, ``memory_mib``, ``sm_count``, ``arch``, ``compute_capability``,
  ``mig_family`` (key into :mod:`gpupool.hardware.mig`, empty when MIG is unsupported), ``mps_capable``).
- ``gpu_model(name)``: look a model up by canonical name or alias (case and punctuation insensitive);
  raises ``UnknownGpuModelError`` (a ``ValueError``) naming the value and the known names.
- ``model_from_nvml_name(name, total_mib=...)``: map an NVML ``nvmlDeviceGetName`` string to a model.
- ``GPU_MODELS``: every model, in catalogue order.

Invariants:
- Canonical names and aliases are unique after normalisation (checked at import).
- ``memory_mib`` is the full-card total that ``nvidia-smi`` shows (MiB); values marked unverified in the
  fact sheet are planning estimates only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Arch(StrEnum):
    VOLTA = "volta"
    TURING = "turing"
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"


NVML_ARCH = {5: Arch.VOLTA, 6: Arch.TURING, 7: Arch.AMPERE, 8: Arch.ADA, 9: Arch.HOPPER, 10: Arch.BLACKWELL}
"""NVML ``nvmlDeviceGetArchitecture`` value -> `Arch`."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Planning facts of one GPU model."""

    name: str
    memory_mib: int
    sm_count: int
    arch: Arch
    compute_capability: tuple[int, int]
    mig_family: str = ""
    """Key into ``gpupool.hardware.mig.MIG_FAMILIES``; empty when the model has no MIG."""
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()
    """Substrings of ``nvmlDeviceGetName`` that identify this model (matched after normalisation)."""
    pci_ids: tuple[str, ...] = ()
    """``0xDDDD10DE`` device filters as mig-parted writes them."""
    verified: bool = True
    """False where the fact sheet marks the memory/SM numbers as unverified."""

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_family)

    @property
    def mps_capable(self) -> bool:
        """CUDA MPS with per-client isolated address spaces and memory limits: Volta and newer."""
        return self.compute_capability >= (7, 0)


def _m(
    name: str,
    memory_mib: int,
    sm_count: int,
    arch: Arch,
    cc: tuple[int, int],
    *,
    mig: str = "",
    aliases: tuple[str, ...] = (),
    nvml: tuple[str, ...] = (),
    pci: tuple[str, ...] = (),
    verified: bool = True,
) -> GpuModel:
    return GpuModel(
        name=name,
        memory_mib=memory_mib,
        sm_count=sm_count,
        arch=arch,
        compute_capability=cc,
        mig_family=mig,
        aliases=aliases,
        nvml_names=nvml,
        pci_ids=pci,
        verified=verified,
    )


GPU_MODELS: tuple[GpuModel, ...] = (
    _m(
        "A100-SXM4-40GB", 40537, 108, Arch.AMPERE, (8, 0), mig="a100-40gb",
        aliases=("A100-40GB", "A100-SXM-40GB"), nvml=("A100-SXM4-40GB",), pci=("0x20B010DE", "0x20B110DE"),
    ),
    _m(
        "A100-PCIE-40GB", 40537, 108, Arch.AMPERE, (8, 0), mig="a100-40gb",
        aliases=(), nvml=("A100-PCIE-40GB",), pci=("0x20F110DE", "0x20F610DE"),
    ),
    _m(
        "A100-SXM4-80GB", 81920, 108, Arch.AMPERE, (8, 0), mig="a100-80gb",
        aliases=("A100-80GB", "A100-SXM-80GB"), nvml=("A100-SXM4-80GB",), pci=("0x20B210DE",),
    ),
    _m(
        "A100-PCIE-80GB", 81920, 108, Arch.AMPERE, (8, 0), mig="a100-80gb",
        aliases=(), nvml=("A100 80GB PCIE", "A100-PCIE-80GB"), pci=("0x20B510DE",),
    ),
    _m("A30-24GB", 24576, 56, Arch.AMPERE, (8, 0), mig="a30", aliases=("A30",), nvml=("A30",),
       pci=("0x20B710DE",)),
    _m(
        "H100-SXM5-80GB", 81559, 132, Arch.HOPPER, (9, 0), mig="h100-80gb-sxm",
        aliases=("H100-80GB", "H100-SXM-80GB", "H100-SXM5"), nvml=("H100 80GB HBM3", "H100-SXM5-80GB"),
        pci=("0x233010DE",),
    ),
    _m(
        "H100-PCIE-80GB", 81559, 114, Arch.HOPPER, (9, 0), mig="h100-80gb-pcie",
        aliases=("H100-PCIE",), nvml=("H100 PCIE",), pci=("0x233110DE",),
    ),
    _m(
        "H100-NVL-94GB", 95830, 132, Arch.HOPPER, (9, 0), mig="h100-94gb",
        aliases=("H100-94GB", "H100-NVL"), nvml=("H100 NVL",), pci=("0x232110DE",), verified=False,
    ),
    _m(
        "H200-141GB", 143771, 132, Arch.HOPPER, (9, 0), mig="h200",
        aliases=("H200", "H200-SXM5-141GB", "H200-NVL-141GB", "H200-NVL"), nvml=("H200",),
        pci=("0x233510DE", "0x233B10DE"), verified=False,
    ),
    _m(
        "H20-96GB", 97871, 78, Arch.HOPPER, (9, 0), mig="h20",
        aliases=("H20",), nvml=("H20",), pci=("0x232910DE",), verified=False,
    ),
    _m(
        "B200-180GB", 183359, 148, Arch.BLACKWELL, (10, 0), mig="b200",
        aliases=("B200",), nvml=("B200",), pci=("0x290110DE",), verified=False,
    ),
    _m("L40S-48GB", 46068, 142, Arch.ADA, (8, 9), aliases=("L40S",), nvml=("L40S",)),
    _m("L4-24GB", 23034, 58, Arch.ADA, (8, 9), aliases=("L4",), nvml=("L4",)),
    _m(
        "RTX4090-24GB", 24564, 128, Arch.ADA, (8, 9),
        aliases=("RTX-4090", "GeForce-RTX-4090-24GB"), nvml=("RTX 4090",),
    ),
    _m("A10-24GB", 23028, 72, Arch.AMPERE, (8, 6), aliases=("A10",), nvml=("A10",)),
    _m("T4-16GB", 15360, 40, Arch.TURING, (7, 5), aliases=("T4", "Tesla-T4"), nvml=("T4",)),
    _m(
        "V100-16GB", 16160, 80, Arch.VOLTA, (7, 0),
        aliases=("V100-SXM2-16GB", "V100-PCIE-16GB", "V100"), nvml=("V100-SXM2-16GB", "V100-PCIE-16GB"),
    ),
    _m(
        "V100-32GB", 32510, 80, Arch.VOLTA, (7, 0),
        aliases=("V100-SXM2-32GB", "V100-PCIE-32GB"), nvml=("V100-SXM2-32GB", "V100-PCIE-32GB"),
    ),
)  # fmt: skip


def _norm(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", name.upper())


def _build_index() -> dict[str, GpuModel]:
    index: dict[str, GpuModel] = {}
    for model in GPU_MODELS:
        for key in (model.name, *model.aliases):
            k = _norm(key)
            if k in index:
                raise AssertionError(f"GPU catalogue: name {key!r} used twice")
            index[k] = model
    return index


_INDEX = _build_index()


class UnknownGpuModelError(ValueError):
    """A GPU model name that is not in the catalogue; the message lists the known names."""

    def __init__(self, name: object) -> None:
        self.name = name
        known = ", ".join(m.name for m in GPU_MODELS)
        super().__init__(f"unknown GPU model {name!r} (known: {known})")


def gpu_model(name: str) -> GpuModel:
    """The catalogue entry for ``name`` (canonical name or alias; case and punctuation ignored)."""
    if not isinstance(name, str):
        raise UnknownGpuModelError(name)
    model = _INDEX.get(_norm(name))
    if model is None:
        raise UnknownGpuModelError(name)
    return model


def known_gpu_models() -> tuple[str, ...]:
    return tuple(m.name for m in GPU_MODELS)


def model_from_nvml_name(nvml_name: str, *, total_mib: int = 0) -> GpuModel | None:
    """Best catalogue match for an NVML device name (e.g. ``"NVIDIA A100-SXM4-80GB"``), or None.

    Longest matching pattern wins (so "A100" never shadows "A100-SXM4-80GB", "L4" never shadows
    "L40S"); among equal lengths the model whose memory is closest to ``total_mib`` wins, then
    catalogue order.
    """
    norm = _norm(nvml_name)
    best: tuple[int, int, int] | None = None
    found: GpuModel | None = None
    for order, model in enumerate(GPU_MODELS):
        for pattern in model.nvml_names:
            p = _norm(pattern)
            # token-ish match: the pattern must not run into further digits (L4 vs L40S, A10 vs A100)
            idx = norm.find(p)
            if idx < 0:
                continue
            tail = norm[idx + len(p) : idx + len(p) + 1]
            if tail.isdigit():
                continue
            mem_gap = abs(model.memory_mib - total_mib) if total_mib else 0
            key = (-len(p), mem_gap, order)
            if best is None or key < best:
                best, found = key, model
    return found
