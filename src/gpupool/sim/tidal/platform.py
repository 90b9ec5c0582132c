"""The seed's platform (8 x A100-80GB + 4 x L40S-48GB, four-tier model matrix) under three layouts.

- ``dedicated``: one model per whole GPU, no sharing: main LLM on 6 A100 + 2 L40S, embedding and
  rerank on one A100 each, guardrail on one L40S, batch (P2) on one L40S.
- ``static-slicing``: the MIG/MPS layout, fixed all day. The main LLM keeps whole cards where its
  prefill is TTFT-bound (A100 #0-5, L40S #3); A100 #6/#7 are MIG ``3g.40gb`` (main) + ``2g.20gb``
  (P2 pool) + 2 x ``1g.10gb`` (embedding, rerank) (legal: 2g@0, 1g@2, 1g@3, 3g@4); L40S #0/#1 are
  MPS guardrail (20 %, 4 GiB) + main (80 %, 40 GiB); L40S #2 is the P2 pool. P2 holds 12.7 % of the
  compute, inside the 20 % day share.
- ``tidal``: the static layout by day; at NIGHT the non-reserve online instances are slept and
  their slices lent to batch engines, A100 #7 is re-partitioned 3g+2g+1g+1g -> 7g for one large
  batch instance, and the reserve's idle time is lent request by request.

Each instance names its slice in the core's terms (`Slice`) so the simulation can drive the real
`Allocator` with placement leases. MIG layouts are checked with the hardware layer's validator.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.hardware.mig import MigInstance, mig_profile, validate_layout
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources
from gpupool.sim.tidal import perf
from gpupool.sim.tidal.perf import A100_80GB, L40S, GpuSpec, SliceSpec

A100 = "A100-SXM4-80GB"
DAY_LAYOUT_A100_MIG = (MigInstance("2g.20gb", 0), MigInstance("1g.10gb", 2), MigInstance("1g.10gb", 3),
                       MigInstance("3g.40gb", 4))  # fmt: skip
NIGHT_LAYOUT_A100_MIG = (MigInstance("7g.80gb", 0),)


@dataclass(frozen=True, slots=True)
class Instance:
    """One engine on one slice. ``role``: main | guard | embed | rerank | batch."""

    name: str
    role: str
    gpu: str
    spec: SliceSpec
    kind: SliceKind
    lend: str = "never"
    """How NIGHT lends it: never | engine (sleep it, run a batch engine) | request (P2 in its idle
    time) | partition (its GPU is re-partitioned to one large batch instance)."""

    @property
    def slice_id(self) -> str:
        return f"{self.gpu}/{self.spec.label}/{self.name}"

    def core_slice(self) -> Slice:
        milli = round(self.spec.sm_fraction * 1000)
        return Slice(
            id=self.slice_id,
            node=self.gpu,
            gpu_id=self.gpu,
            kind=self.kind,
            capacity=Resources(self.spec.vram_mib, milli),
            gpu_model=self.spec.gpu.name,
            profile=self.spec.label,
        )


@dataclass(frozen=True, slots=True)
class Platform:
    strategy: str
    instances: tuple[Instance, ...]
    gpus: tuple[tuple[str, GpuSpec], ...]

    def by_role(self, role: str) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.role == role)


def _gpus() -> tuple[tuple[str, GpuSpec], ...]:
    return tuple([(f"a100-{i}", A100_80GB) for i in range(8)] + [(f"l40s-{i}", L40S) for i in range(4)])


def _mig(name: str) -> SliceSpec:
    p = mig_profile(A100, name)
    return perf.mig(A100_80GB, sm_count=p.sm_count, memory_slices=p.memory_slices, memory_mib=p.memory_mib,
                    label=name)  # fmt: skip


def dedicated() -> Platform:
    w, wl = perf.whole(A100_80GB), perf.whole(L40S)
    inst = [Instance(f"main-a{i}", "main", f"a100-{i}", w, SliceKind.WHOLE) for i in range(6)]
    inst += [
        Instance("embed-a6", "embed", "a100-6", w, SliceKind.WHOLE),
        Instance("rerank-a7", "rerank", "a100-7", w, SliceKind.WHOLE),
        Instance("guard-l0", "guard", "l40s-0", wl, SliceKind.WHOLE),
        Instance("main-l1", "main", "l40s-1", wl, SliceKind.WHOLE),
        Instance("main-l2", "main", "l40s-2", wl, SliceKind.WHOLE),
        Instance("batch-l3", "batch", "l40s-3", wl, SliceKind.WHOLE),
    ]
    return Platform("dedicated", tuple(inst), _gpus())


def sliced(strategy: str) -> Platform:
    """The static MIG/MPS layout; ``tidal`` adds the night lending marks."""
    validate_layout(A100, DAY_LAYOUT_A100_MIG)
    validate_layout(A100, NIGHT_LAYOUT_A100_MIG)
    tidal = strategy == "tidal"
    w, wl = perf.whole(A100_80GB), perf.whole(L40S)
    g3, g2, g1 = _mig("3g.40gb"), _mig("2g.20gb"), _mig("1g.10gb")
    guard = perf.mps(L40S, pct=20, vram_mib=4096, label="mps20")
    main_mps = perf.mps(L40S, pct=80, vram_mib=40 * 1024, label="mps80")
    inst = [Instance("main-a0", "main", "a100-0", w, SliceKind.WHOLE, "request" if tidal else "never")]
    inst += [Instance(f"main-a{i}", "main", f"a100-{i}", w, SliceKind.WHOLE, "engine" if tidal else "never")
             for i in range(1, 6)]  # fmt: skip
    for i, lend in ((6, "request"), (7, "partition")):
        gpu = f"a100-{i}"
        mark = lend if tidal else "never"
        inst += [
            Instance(f"main-a{i}", "main", gpu, g3, SliceKind.MIG, mark),
            Instance(f"pool-a{i}", "batch", gpu, g2, SliceKind.MIG, mark if mark == "partition" else "never"),
            Instance(f"embed-a{i}", "embed", gpu, g1, SliceKind.MIG, mark),
            Instance(f"rerank-a{i}", "rerank", gpu, perf.SliceSpec(A100_80GB, g1.sm_fraction, g1.mem_fraction,
                     g1.vram_mib, "1g.10gb-b"), SliceKind.MIG, "partition" if tidal and i == 7 else "never"),
        ]  # fmt: skip
    for i in (0, 1):
        gpu = f"l40s-{i}"
        inst += [
            Instance(f"guard-l{i}", "guard", gpu, guard, SliceKind.MPS),
            Instance(f"main-l{i}", "main", gpu, main_mps, SliceKind.MPS, "engine" if tidal else "never"),
        ]
    inst += [
        Instance("pool-l2", "batch", "l40s-2", wl, SliceKind.WHOLE),
        Instance("main-l3", "main", "l40s-3", wl, SliceKind.WHOLE, "engine" if tidal else "never"),
    ]
    return Platform(strategy, tuple(inst), _gpus())


def build(strategy: str) -> Platform:
    if strategy == "dedicated":
        return dedicated()
    if strategy in ("static-slicing", "tidal"):
        return sliced(strategy)
    if strategy in (WHAT_IF, LENDING):
        p = sliced("tidal")
        return Platform(strategy, p.instances, p.gpus)
    raise ValueError(f"invalid strategy={strategy!r}: expected one of {', '.join(STRATEGIES)}")


LENDING = "tidal-lending"
"""tidal + SLO-guarded day lending: P2 requests in the idle main/embedding engines by DAY at the level
the core's `LendingGuard` sets from the measured P0 TTFT attainment (`gpupool.core.tidal.lending`)."""
STRATEGIES = ("dedicated", "static-slicing", "tidal", LENDING)
WHAT_IF = "tidal+day-lending"
"""Not one of the issue's strategies: tidal plus request-level P2 in idle main/embedding engines by
DAY too (P0 pays the holdback). It shows what the seed's 72 % would need; see the report."""
