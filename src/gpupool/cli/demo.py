"""`gpupool demo` / `gpupool run`: the allocator on the seed's example pool, before and after a P0
preemption, as rich tables. (`run` becomes the gateway service once it exists.)"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gpupool.core import P0, P1, P2, Allocator, ManualClock, Request, Resources, Slice, SliceKind
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.priority import band
from gpupool.hardware.units import compute_milli_from_pct


def seed_example_pool() -> list[Slice]:
    """The seed's platform in miniature: an A100-80GB cut 3g.40gb@0 + 1g.10gb@4 + 1g.10gb@5 (+ a
    1g.10gb@6 pool slice: a legal layout, checked in tests against the hardware validator), an L40S-48GB
    shared by MPS (a 4 GB guardrail share and a 44 GB batch pool) and a whole H100."""
    a100 = "gpu-a/0"
    l40s = "gpu-b/0"

    def mig(profile: str, start: int, vram_gib: int, sm_sevenths: int) -> Slice:
        return Slice(
            id=f"gpu-a/0/mig-{profile}-{start}",
            node="gpu-a",
            gpu_id=a100,
            kind=SliceKind.MIG,
            capacity=Resources(vram_gib * 1024, sm_sevenths * 1000 // 7),
            gpu_model="A100-SXM4-80GB",
            profile=profile,
        )

    def mps(name: str, vram_gib: int, pct: int) -> Slice:
        return Slice(
            id=f"gpu-b/0/{name}",
            node="gpu-b",
            gpu_id=l40s,
            kind=SliceKind.MPS,
            capacity=Resources(vram_gib * 1024, compute_milli_from_pct(pct)),
            gpu_model="L40S-48GB",
            profile=f"mps-{vram_gib}g",
        )

    return [
        mig("3g.40gb", 0, 40, 3),
        mig("1g.10gb", 4, 10, 1),
        mig("1g.10gb", 5, 10, 1),
        mig("1g.10gb", 6, 10, 1),
        mps("mps-guardrail", 4, 20),
        mps("mps-pool", 44, 80),
        Slice(
            id="gpu-c/0",
            node="gpu-c",
            gpu_id="gpu-c/0",
            kind=SliceKind.WHOLE,
            capacity=Resources(81920, 1000),
            gpu_model="H100-SXM5-80GB",
        ),
    ]


def _slices_table(alloc: Allocator, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("slice", "kind", "capacity", "granted", "free", "leases"):
        t.add_column(col, justify="right" if col in ("leases",) else "left")
    for st in alloc.states():
        t.add_row(
            st.slice.id,
            st.slice.kind.value,
            str(st.slice.capacity),
            str(st.granted),
            str(st.free),
            str(st.num_leases),
        )
    return t


def _leases_table(alloc: Allocator, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("request", "band", "slice", "granted", "state"):
        t.add_column(col)
    for lease in sorted(alloc.leases, key=lambda x: x.request.id):
        t.add_row(
            lease.request.id, band(lease.priority), ",".join(lease.slice_ids), str(lease.total), lease.state
        )
    return t


def demo() -> None:
    console = Console()
    clock = ManualClock()
    alloc = Allocator(seed_example_pool(), clock=clock, lease_ids=seeded_lease_ids(7))

    def req(rid: str, prio: int, vram_gib: float, pct: int, kinds: tuple[SliceKind, ...] = ()) -> Request:
        return Request(
            id=rid,
            tenant="demo",
            priority=prio,
            demand=Resources(int(vram_gib * 1024), compute_milli_from_pct(pct)),
            ttl_s=300,
            kinds=frozenset(kinds),
        )

    stream = [
        req("main-llm-qwen32b-awq", P0, 36, 40, (SliceKind.MIG,)),
        req("guardrail-qwen0.5b", P0, 3, 10, (SliceKind.MPS,)),
        req("embed-bge-m3", P1, 4, 10, (SliceKind.MIG,)),
        req("rerank-bge-reranker", P1, 3, 10, (SliceKind.MIG,)),
        req("batch-reembed-1", P2, 30, 40),
        req("batch-eval-2", P2, 40, 40),
        req("batch-ocr-3", P2, 12, 20),
    ]
    for r in stream:
        out = alloc.allocate(r)
        where = ",".join(out.lease.slice_ids) if out.lease else "-"
        console.print(
            f"allocate {r.id:<24} {band(r.priority)} {r.demand!s:<22} -> {out.code.value:<18} {where}"
        )
    console.print(_slices_table(alloc, "Slices before the P0 burst"))
    console.print(_leases_table(alloc, "Leases before the P0 burst"))
    burst = req("agent-session-burst", P0, 60, 50)
    out = alloc.allocate(burst)
    console.print(
        f"\n[bold]P0 {burst.id}[/] needs {burst.demand}: {out.code.value} on "
        f"{','.join(out.lease.slice_ids) if out.lease else '-'}; victims: "
        f"{', '.join(v.request.id for v in out.victims) or 'none'} (only what was needed, on that slice)"
    )
    console.print(_slices_table(alloc, "Slices after"))
    console.print(_leases_table(alloc, "Leases after"))
    alloc.check_invariants()


def run() -> None:
    """Until the gateway exists, `run` shows the allocator demonstration."""
    demo()
