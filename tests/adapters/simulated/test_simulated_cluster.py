"""The simulated cluster: deterministic, seeded, follows leases and placed workloads, forced readings."""

from pathlib import Path

import yaml

from gpupool.adapters.simulated import SimulatedCluster
from gpupool.core import P0, P2, Allocator, ManualClock, Request, Resources
from gpupool.hardware.devices import DeviceSource, inventory_from_snapshot, reconcile_inventory
from gpupool.hardware.planner import plan
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.spec import load_cluster_spec, load_workload_spec

ROOT = Path(__file__).resolve().parents[3]


def _example() -> SimulatedCluster:
    cluster = load_cluster_spec(yaml.safe_load((ROOT / "examples/cluster-a100-l40s.yaml").read_text()))
    wl = load_workload_spec(yaml.safe_load((ROOT / "examples/workloads-agent-platform.yaml").read_text()))
    return SimulatedCluster(cluster, plan(cluster, wl), seed=7)


def test_same_seed_same_readings_and_protocol():
    a, b = _example(), _example()
    for _ in range(3):
        assert a.read_all() == b.read_all()
        a.advance(1.0)
        b.advance(1.0)
    assert isinstance(a.source("gpu-a"), DeviceSource)
    assert a.source("gpu-a").read().source == "simulated"


def test_mig_gpu_reports_like_nvml():
    sim = _example()
    g = sim.read("gpu-a").gpu(0)
    assert g.mig_enabled and g.utilization_pct is None
    assert {(d.profile, d.start) for d in g.mig_devices} == {("3g.40gb", 0), ("3g.40gb", 4)}
    d = next(d for d in g.mig_devices if d.start == 0)
    assert d.memory_total_mib == 40192 and d.engine_active_pct == 30 and d.memory_used_mib > 30_000
    assert g.memory_used_mib == sum(x.memory_used_mib for x in g.mig_devices)


def test_inventory_round_trips_through_discovery():
    sim = _example()
    planned = sim.inventory()
    discovered = {
        s.id: s for snap in sim.read_all() for s in inventory_from_snapshot(snap) if s.kind is SliceKind.MIG
    }
    for s in planned:
        if s.kind is SliceKind.MIG:
            assert (
                discovered[s.id].uuid == s.uuid and discovered[s.id].capacity.vram_mib == s.capacity.vram_mib
            )
    assert all(s.healthy for s in reconcile_inventory(planned, sim.read_all()))


def test_memory_and_utilisation_follow_leases():
    sim = _example()
    pool = "gpu-b/1/whole"
    before = sim.read("gpu-b").gpu(1)
    assert before.memory_used_mib == 0 and before.utilization_pct <= 2
    sim.grant("lease-1", pool, vram_mib=30_000, compute_milli=800)
    after = sim.read("gpu-b").gpu(1)
    assert after.memory_used_mib == 30_000 and 78 <= after.utilization_pct <= 82
    t0 = after.temperature_c
    sim.advance(120.0)
    hot = sim.read("gpu-b").gpu(1)
    assert hot.temperature_c > t0 + 20 and hot.power_mw > before.power_mw
    sim.release("lease-1")
    sim.advance(300.0)
    cool = sim.read("gpu-b").gpu(1)
    assert cool.memory_used_mib == 0 and cool.temperature_c < hot.temperature_c


def test_force_lose_and_xid_hooks():
    sim = _example()
    sim.force("gpu-b/0", memory_used_mib=42_000, temperature_c=85)
    g = sim.read("gpu-b").gpu(0)
    assert (g.memory_used_mib, g.temperature_c) == (42_000, 85)
    sim.xid("gpu-b/0", 13)
    snap = sim.read("gpu-b")
    assert [e.xid for e in snap.events] == [13] and snap.gpu(0).healthy
    assert sim.read("gpu-b").events == ()
    sim.lose("gpu-a/1")
    g = sim.read("gpu-a").gpu(1)
    assert not g.healthy and "GPU is lost" in g.error
    assert not {s.id: s for s in sim.inventory()}["gpu-a/1/mig-3g.40gb-4"].healthy
    sim.clear("gpu-a/1")
    assert sim.read("gpu-a").gpu(1).healthy
    sim.xid("gpu-b/1", 79)
    assert not sim.read("gpu-b").gpu(1).healthy


def test_drives_the_core_allocator():
    """The simulated inventory is what the allocator consumes; leases move the simulated readings."""
    sim = _example()
    alloc = Allocator(sim.inventory().slices, clock=ManualClock(0.0))
    out = alloc.allocate(Request("batch-1", "t", P2, Resources(20_000, 500), ttl_s=60.0))
    assert out.lease is not None
    grant = out.lease.grants[0]
    sim.grant(
        out.lease.id,
        grant.slice_id,
        vram_mib=grant.resources.vram_mib,
        compute_milli=grant.resources.compute_milli,
    )
    gpu_id = grant.gpu_id
    node, index = gpu_id.split("/")
    assert sim.read(node).gpu(int(index)).memory_used_mib >= 20_000
    assert P0 > P2


def test_without_plan_every_card_is_whole():
    cluster = load_cluster_spec({"nodes": [{"name": "n", "gpus": [{"model": "L4-24GB", "count": 2}]}]})
    sim = SimulatedCluster(cluster, seed=1)
    assert [s.id for s in sim.inventory()] == ["n/0/whole", "n/1/whole"]
    assert [g.model for g in sim.read("n").gpus] == ["L4-24GB", "L4-24GB"]
    assert SimulatedCluster(cluster, seed=1).inventory() == sim.inventory()
    assert SimulatedCluster(cluster, seed=2).inventory() != sim.inventory()


def test_embedded_default_matches_examples():
    from gpupool.adapters.simulated import DEFAULT_CLUSTER, DEFAULT_WORKLOADS, embedded_default

    assert yaml.safe_load((ROOT / "examples/cluster-a100-l40s.yaml").read_text()) == DEFAULT_CLUSTER
    assert yaml.safe_load((ROOT / "examples/workloads-agent-platform.yaml").read_text()) == DEFAULT_WORKLOADS
    sim = embedded_default(seed=3)
    assert sim.plan is not None and sim.plan.gpus_used == 3
    assert sim.read_all() == embedded_default(seed=3).read_all()


def test_readings_follow_any_sequence_of_grants_and_releases():
    """Grants (also re-grants of one lease id) and releases in a random order: every reading equals
    one of a fresh cluster given only the leases still held (the per-slice sums stay exact)."""
    import random

    rng = random.Random(3)
    sim = _example()
    slices = sorted(sim._slice_gpu)
    held: dict[str, tuple[str, int, int]] = {}
    for step in range(400):
        lid = f"l{rng.randrange(30)}"
        if rng.random() < 0.6:
            sid, mib, milli = rng.choice(slices), rng.randrange(0, 9000), rng.randrange(0, 600)
            sim.grant(lid, sid, vram_mib=mib, compute_milli=milli)
            held[lid] = (sid, mib, milli)
        else:
            sim.release(lid)
            held.pop(lid, None)
        if step % 40 == 39:
            fresh = _example()
            for lid2, (sid, mib, milli) in held.items():
                fresh.grant(lid2, sid, vram_mib=mib, compute_milli=milli)
            for node in sim.nodes():
                got, want = sim.read(node), fresh.read(node)
                assert [g.memory_used_mib for g in got.gpus] == [g.memory_used_mib for g in want.gpus]
    for lid in list(held):
        sim.release(lid)
    assert all(g.memory_used_mib == _example().read(n).gpu(g.index).memory_used_mib
               for n in sim.nodes() for g in sim.read(n).gpus)  # fmt: skip
