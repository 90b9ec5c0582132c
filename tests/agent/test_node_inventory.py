"""Discovery (`gpupool.agent.inventory.discover`) on NVML fixture readings replayed through the real
`NvmlDeviceSource`, and on the simulated cluster: adopt what the plan names, report what differs,
choose the mode of unplanned GPUs through the capability rule."""

from __future__ import annotations

from pathlib import Path

from gpupool.adapters.nvml import FakeNvml, NvmlDeviceSource
from gpupool.adapters.simulated import embedded_default
from gpupool.agent.inventory import discover
from gpupool.hardware.devices import DeviceSnapshot, GpuReading
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


def _snap(name: str, node: str = "n1") -> DeviceSnapshot:
    src = NvmlDeviceSource(node, nvml=FakeNvml.from_fixture(FIXTURES / name), clock=lambda: 1.0)
    try:
        return src.read()
    finally:
        src.close()


def test_existing_mig_instances_are_adopted_with_me_profiles_and_device_uuids() -> None:
    inv = discover(_snap("h100-sxm5-mig-me-pending.json"))
    by_id = {s.id: s for s in inv.slices}
    me = by_id["n1/0/mig-1g.10gb+me-0"]
    assert me.kind is SliceKind.MIG and me.profile == "1g.10gb+me"
    assert me.uuid == "MIG-aaaaaaaa-0000-5000-8000-000000000002" and me.capacity.vram_mib == 9984
    assert by_id["n1/0/mig-3g.40gb-4"].uuid == "MIG-aaaaaaaa-0000-5000-8000-000000000001"
    g0, g1 = inv.gpus
    assert (g0.mode, g0.origin, g0.pci_bus_id) == ("mig", "detected", "00000000:18:00.0")
    assert ("MIG-aaaaaaaa-0000-5000-8000-000000000002", "1g.10gb+me", 7, 0) in g0.instances
    # GPU 1: MIG-capable, MIG off now, enable pending: served whole, reported as a difference
    assert by_id["n1/1/whole"].kind is SliceKind.WHOLE and g1.mig_pending is True
    assert g1.memory_reserved_mib == 512
    assert any("n1/1" in d and "pending" in d for d in inv.differences)


def test_volta_or_newer_without_mig_gets_an_mps_share_with_its_pipe_dir() -> None:
    inv = discover(_snap("l40s.json"), mps_pipe_dirs={"n1/0": "/run/mps/0"})
    (s,) = inv.slices
    assert (s.id, s.kind) == ("n1/0/mps-pool", SliceKind.MPS)
    assert s.capacity.vram_mib == inv.gpus[0].memory_total_mib - 512
    assert inv.pipe_dir(s.id) == "/run/mps/0" and inv.gpus[0].flagged is False
    assert inv.to_json()["slices"][0]["mps_pipe_dir"] == "/run/mps/0"


def test_an_unknown_model_is_served_whole_and_flagged() -> None:
    g = GpuReading(0, "GPU-p100", "Tesla P100-PCIE-16GB", "", 16280, 0)
    inv = discover(DeviceSnapshot("n1", 0.0, (g,)))
    assert [s.id for s in inv.slices] == ["n1/0/whole"]
    assert inv.gpus[0].flagged and "without VRAM isolation" in inv.gpus[0].reason


def _planned(start: int, profile: str, vram_mib: int) -> Slice:
    return Slice(
        id=f"n1/0/mig-{profile}-{start}",
        node="n1",
        gpu_id="n1/0",
        kind=SliceKind.MIG,
        capacity=Resources(vram_mib, 142),
        gpu_model="A100-SXM4-80GB",
        profile=profile,
    )


def test_plan_is_adopted_and_differences_reported() -> None:
    """The A100 fixture has 1g.10gb@0, 1g.10gb@1 and 3g.40gb@4; the plan names @0, @2 and @4."""
    plan = [_planned(0, "1g.10gb", 9728), _planned(2, "1g.10gb", 9728), _planned(4, "3g.40gb", 40192)]
    inv = discover(_snap("a100-80gb-mig-3g40-2x1g10.json"), planned=plan)
    by_id = {s.id: s for s in inv.slices}
    assert set(by_id) == {p.id for p in plan}
    assert by_id["n1/0/mig-3g.40gb-4"].uuid.startswith("MIG-3b9a3c6e") and by_id["n1/0/mig-3g.40gb-4"].healthy
    assert by_id["n1/0/mig-1g.10gb-0"].healthy and by_id["n1/0/mig-1g.10gb-0"].uuid
    assert not by_id["n1/0/mig-1g.10gb-2"].healthy
    assert inv.gpus[0].origin == "plan"
    assert any("mig-1g.10gb-2 is not on the device" in d for d in inv.differences)
    assert any("1g.10gb@1" in d and "not in the plan" in d for d in inv.differences)


def test_a_planned_gpu_missing_from_the_node_is_reported() -> None:
    other = Slice("n1/5/whole", "n1", "n1/5", SliceKind.WHOLE, Resources(81920, 1000), gpu_index=5)
    inv = discover(_snap("l40s.json"), planned=[other])
    assert "n1/5: planned but not on this node" in inv.differences


def test_health_is_the_agents_view_and_nvml_errors() -> None:
    snap = _snap("gpu-lost.json")
    inv = discover(snap, unhealthy={"n1/0": "xid 79"})
    assert [s.healthy for s in inv.slices] == [False, False]
    assert "xid 79" in inv.gpus[0].reason and "GPU is lost" in inv.gpus[1].reason
    assert [s.healthy for s in discover(snap).slices] == [True, False]


def test_simulated_devices_give_the_same_view() -> None:
    cluster = embedded_default()
    node = sorted(cluster.nodes())[0]
    snap = cluster.source(node).read()
    inv = discover(snap)
    assert inv.slices and all(s.node == node for s in inv.slices)
    assert all(g.pci_bus_id.startswith("00000000:") for g in inv.gpus)
    for g in snap.gpus:
        if g.mig_enabled:
            uuids = {s.uuid for s in inv.slices if s.gpu_id == f"{node}/{g.index}"}
            assert uuids == {d.uuid for d in g.mig_devices}


def test_nvml_samples_give_dcgm_exporter_labels() -> None:
    """NVML's device name and PCI bus id reach the agent's samples; a MIG instance's series carries
    the parent GPU's UUID and PCI bus id, told apart by its profile (``+me`` kept) and GI id."""
    from gpupool.agent.devices import SnapshotSource
    from gpupool.agent.loop import AgentConfig, NodeAgent
    from gpupool.agent.runtime import gauges_of
    from gpupool.core.clock import ManualClock

    nvml = NvmlDeviceSource("n1", nvml=FakeNvml.from_fixture(FIXTURES / "h100-sxm5-mig-me-pending.json"))
    agent = NodeAgent(AgentConfig("n1"), SnapshotSource(nvml, node="n1"), {}, clock=ManualClock())
    try:
        view = gauges_of(agent.tick(), last_xid={}, reporter=None)
    finally:
        nvml.close()
    parent = next(g for g in view.gpus if g.index == 0 and not g.mig_profile)
    me = next(g for g in view.gpus if g.mig_profile == "1g.10gb+me")
    assert parent.model == "NVIDIA H100 80GB HBM3" and parent.pci_bus_id == "00000000:18:00.0"
    assert (me.uuid, me.pci_bus_id, me.gi_id) == (parent.uuid, "00000000:18:00.0", 7)


def test_a_gpu_nvml_cannot_read_keeps_its_slices_unhealthy() -> None:
    """A failure is not a reshape: the lost GPU's MIG slices stay listed (same ids), unhealthy."""
    cluster = embedded_default()
    before = discover(cluster.source("gpu-a").read())
    cluster.xid("gpu-a/0", 79)  # fatal: the simulated GPU is lost, as NVML reports it
    lost = cluster.source("gpu-a").read()
    assert not lost.gpu(0).mig_devices  # nothing to discover any more
    after = discover(lost, previous=before.slices)
    on0 = [[s.id for s in inv.slices if s.gpu_id == "gpu-a/0"] for inv in (before, after)]
    assert on0[0] == on0[1] and len(on0[0]) == 2
    assert not any(s.healthy for s in after.slices if s.gpu_id == "gpu-a/0")
    assert all(s.healthy for s in after.slices if s.gpu_id != "gpu-a/0")
    assert [s.id for s in discover(lost).slices if s.gpu_id == "gpu-a/0"] == ["gpu-a/0/whole"]


def test_mig_on_without_instances_is_listed_unhealthy() -> None:
    """Nothing to lease, but the GPU stays known to the control plane (its readings are accepted)."""
    g = GpuReading(0, "GPU-x", "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", 81559, 0, mig_enabled=True)
    inv = discover(DeviceSnapshot("n1", 0.0, (g,)))
    assert [(s.id, s.healthy) for s in inv.slices] == [("n1/0/whole", False)]
    assert any("no MIG instance exists" in d for d in inv.differences)
