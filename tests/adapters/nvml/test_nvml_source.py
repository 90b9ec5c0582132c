"""NvmlDeviceSource against fixture readings (tests/fixtures/nvml, hand-written from reference facts, not
recorded on hardware): no GPU needed."""

import copy
import importlib
import json
from pathlib import Path

import pytest

from gpupool.adapters.nvml import FakeNvml, NvmlDeviceSource, NvmlUnavailableError, record
from gpupool.adapters.nvml.source import mig_profile_name
from gpupool.hardware.devices import DeviceSource, inventory_from_snapshot, reconcile_inventory
from gpupool.hardware.planner import inventory_from_plan, plan
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.spec import load_cluster_spec, load_workload_spec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _read(name: str, node: str = "gpu-a", fixture: dict | None = None):
    fake = FakeNvml.from_fixture(fixture or _fixture(name))
    src = NvmlDeviceSource(node, nvml=fake, clock=lambda: 12.5)
    assert isinstance(src, DeviceSource)
    snap = src.read()
    src.close()
    assert fake.initialised == 0
    return snap


def test_a100_mig_devices_read_from_nvml():
    snap = _read("a100-80gb-mig-3g40-2x1g10.json")
    assert snap.source == "nvml" and snap.at_s == 12.5 and snap.driver_version == "535.129.03"
    (g,) = snap.gpus
    assert g.model == "A100-SXM4-80GB" and g.mig_enabled and g.healthy
    assert g.utilization_pct is None  # NOT_SUPPORTED with MIG on
    assert (g.temperature_c, g.power_mw, g.memory_total_mib) == (41, 187000, 81920)
    migs = {(d.profile, d.start): d for d in g.mig_devices}
    assert set(migs) == {("3g.40gb", 4), ("1g.10gb", 0), ("1g.10gb", 1)}
    big = migs[("3g.40gb", 4)]
    assert (big.gpu_instance_id, big.compute_instance_id, big.sm_count, big.memory_total_mib) == (
        1,
        0,
        42,
        40192,
    )
    assert big.memory_used_mib == 24600 and big.processes[0].pid == 4101
    assert [p.gpu_instance_id for p in g.processes] == [1, 9, 10]


def test_mig_memory_is_read_not_hard_coded():
    fx = _fixture("a100-80gb-mig-3g40-2x1g10.json")
    fx["devices"][0]["mig_devices"][0]["memory"]["total"] = 39_999 * 1024 * 1024
    inv = inventory_from_snapshot(_read("", fixture=fx))
    s = {x.id: x for x in inv}["gpu-a/0/mig-3g.40gb-4"]
    assert s.capacity.vram_mib == 39_999 and s.capacity.compute_milli == 428
    assert s.uuid == "MIG-3b9a3c6e-7d1f-5b8e-9c7a-1e2f3a4b5c01" and s.kind is SliceKind.MIG


def test_reconcile_plan_with_discovery():
    cluster = load_cluster_spec({"nodes": [{"name": "gpu-a", "gpus": ["A100-SXM4-80GB"]}]})
    wl = load_workload_spec(
        {
            "workloads": [
                {
                    "name": "main",
                    "model": "qwen2.5-32b",
                    "quant": "awq",
                    "max_context": 16384,
                    "concurrency": 4,
                },
                {"name": "emb", "model": "bge-m3", "max_context": 512, "isolation": "mig"},
                {"name": "rr", "model": "bge-reranker-v2-m3", "max_context": 512, "isolation": "mig"},
            ]
        }
    )
    planned = inventory_from_plan(plan(cluster, wl))
    got = {s.id: s for s in reconcile_inventory(planned, [_read("a100-80gb-mig-3g40-2x1g10.json")])}
    assert got["gpu-a/0/mig-3g.40gb-4"].uuid.startswith("MIG-3b9a") and got["gpu-a/0/mig-3g.40gb-4"].healthy
    assert got["gpu-a/0/mig-1g.10gb-0"].uuid.startswith("MIG-8f2c")
    # the planned pool instance 2g.20gb@2 was never created on the device: not usable
    assert not got["gpu-a/0/mig-2g.20gb-2"].healthy


def test_h100_without_mig():
    snap = _read("h100-sxm5-no-mig.json", node="hopper")
    assert [g.model for g in snap.gpus] == ["H100-SXM5-80GB", "H100-SXM5-80GB"]
    g0 = snap.gpus[0]
    assert not g0.mig_enabled and g0.utilization_pct == 63 and g0.memory_used_mib == 73405
    assert g0.memory_used_pct == 90
    assert g0.processes[0].gpu_instance_id == -1
    inv = inventory_from_snapshot(snap)
    assert [(s.id, s.kind, s.capacity.vram_mib, s.capacity.compute_milli) for s in inv] == [
        ("hopper/0/whole", SliceKind.WHOLE, 81559, 1000),
        ("hopper/1/whole", SliceKind.WHOLE, 81559, 1000),
    ]


def test_l40s_no_mig_support():
    (g,) = _read("l40s.json", node="ada").gpus
    assert g.model == "L40S-48GB" and not g.mig_enabled and g.healthy
    assert len(g.processes) == 3


def test_gpu_lost_maps_to_unhealthy_and_events_survive():
    snap = _read("gpu-lost.json")
    g0, g1 = snap.gpus
    assert g0.healthy and not g1.healthy
    assert "GPU is lost" in g1.error and "GpuIsLost" in g1.error
    assert [(e.gpu_uuid, e.xid) for e in snap.events] == [(g0.uuid, 13)]  # XID 13 is not fatal
    inv = {s.id: s for s in inventory_from_snapshot(snap)}
    assert inv["gpu-a/0/whole"].healthy and not inv["gpu-a/1/whole"].healthy


def test_fatal_xid_makes_gpu_unhealthy_until_restart():
    fake = FakeNvml.from_fixture(FIXTURES / "h100-sxm5-no-mig.json")
    src = NvmlDeviceSource("hopper", nvml=fake)
    assert all(g.healthy for g in src.read().gpus)
    fake.inject_event(1, 79)
    snap = src.read()
    assert snap.gpus[0].healthy and not snap.gpus[1].healthy and snap.gpus[1].error == "xid 79"
    assert not src.read().gpus[1].healthy  # sticky
    src.close()


def test_record_round_trip():
    names = ("a100-80gb-mig-3g40-2x1g10.json", "h100-sxm5-no-mig.json", "l40s.json", "gpu-lost.json")
    for name in (*names, "h100-sxm5-mig-me-pending.json"):
        fx = _fixture(name)
        recorded = record(FakeNvml.from_fixture(copy.deepcopy(fx)), description=fx["description"])
        a = _read(name)
        b = _read("", fixture=recorded)
        assert a.gpus == b.gpus, name


def test_record_command_writes_a_fixture_that_replays(tmp_path, monkeypatch):
    """`python -m gpupool.adapters.nvml.record OUT` writes the file (it once crashed on the write)."""
    record_module = importlib.import_module("gpupool.adapters.nvml.record")

    fx = _fixture("l40s.json")
    monkeypatch.setattr(record_module, "load_pynvml", lambda: FakeNvml.from_fixture(copy.deepcopy(fx)))
    out = tmp_path / "rec.json"
    assert record_module.main([str(out), "--description", "l40s again"]) == 0
    written = json.loads(out.read_text())
    assert written["description"] == "l40s again"
    assert _read("", fixture=written).gpus == _read("l40s.json").gpus


def test_record_command_without_nvml_is_exit_2(tmp_path, monkeypatch, capsys):
    record_module = importlib.import_module("gpupool.adapters.nvml.record")

    def missing():
        raise NvmlUnavailableError("nvidia-ml-py is not installed")

    monkeypatch.setattr(record_module, "load_pynvml", missing)
    assert record_module.main([str(tmp_path / "x.json")]) == 2
    assert "cannot record NVML readings" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("slices", "mib", "total", "name"),
    [
        (3, 40192, 81920, "3g.40gb"),
        (1, 9728, 81920, "1g.10gb"),
        (1, 19968, 81920, "1g.20gb"),
        (7, 80896, 81920, "7g.80gb"),
        (3, 40448, 81559, "3g.40gb"),
        (1, 10880, 95830, "1g.12gb"),
        (3, 71424, 143771, "3g.71gb"),
        (2, 11968, 24576, "2g.12gb"),
        (1, 4864, 40537, "1g.5gb"),
    ],
)
def test_profile_names_from_nvml_numbers(slices, mib, total, name):
    assert mig_profile_name(slices, mib, total) == name


def test_without_nvml_the_source_raises_a_clear_error():
    """Without libnvidia-ml (CI) the source says so, with the cause; skipped where NVML works."""
    src = NvmlDeviceSource("n")
    try:
        src.read()
    except NvmlUnavailableError as exc:
        assert str(exc)
        return
    finally:
        src.close()
    pytest.skip("NVML works on this machine (test_real_nvml_smoke runs instead)")


def test_real_nvml_smoke():
    """A smoke test of the real NVML; SKIPPED, not passed, on a machine without a GPU."""
    src = NvmlDeviceSource("n")
    try:
        snap = src.read()
    except NvmlUnavailableError as exc:
        src.close()
        pytest.skip(f"no GPU / NVML here: {exc}")
    try:
        assert snap.source == "nvml" and snap.gpus
        assert all(g.memory_total_mib > 0 for g in snap.gpus if g.healthy)
        assert len(inventory_from_snapshot(snap)) >= len(snap.gpus)
    finally:
        src.close()


def test_unprivileged_parent_memory_under_mig_falls_back_to_mig_devices():
    fx = _fixture("a100-80gb-mig-3g40-2x1g10.json")
    fx["devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo": 4}  # NO_PERMISSION on the parent only
    (g,) = _read("", fixture=fx).gpus
    assert g.healthy and g.mig_enabled
    assert g.memory_total_mib == 81920  # from the catalogue entry matched by name
    assert g.memory_used_mib == 24600 + 2744 + 2816
    assert {d.profile for d in g.mig_devices} == {"3g.40gb", "1g.10gb"}


def test_mig_device_lost_with_parent():
    fx = _fixture("a100-80gb-mig-3g40-2x1g10.json")
    fx["devices"][0]["mig_devices"][1]["errors"] = {"nvmlDeviceGetMemoryInfo": 15}
    (g,) = _read("", fixture=fx).gpus
    assert not g.healthy and "GPU is lost" in g.error


def test_h100_mig_engine_activity_from_gpm():
    fake = FakeNvml.from_fixture(FIXTURES / "h100-sxm5-mig-gpm.json")
    src = NvmlDeviceSource("hopper", nvml=fake)
    first = src.read().gpus[0]
    assert first.model == "H100-SXM5-80GB" and first.mig_enabled and first.utilization_pct is None
    assert {(d.profile, d.start) for d in first.mig_devices} == {
        ("3g.40gb", 4),
        ("2g.20gb", 0),
        ("1g.10gb", 2),
        ("1g.10gb", 3),
    }
    assert all(d.engine_active_pct is None for d in first.mig_devices)  # one sample is not a rate
    second = {d.start: d.engine_active_pct for d in src.read().gpus[0].mig_devices}
    assert second == {4: 71, 0: 0, 2: 12, 3: 0}
    third = {d.start: d.engine_active_pct for d in src.read().gpus[0].mig_devices}
    assert third == {4: 88, 0: 0, 2: 14, 3: 0}
    assert fake.gpm_live == 4  # one live sample per GPU instance, earlier ones freed
    src.close()
    assert fake.gpm_live == 0
    inv = {s.id: s for s in inventory_from_snapshot(_read("h100-sxm5-mig-gpm.json", node="hopper"))}
    assert inv["hopper/0/mig-3g.40gb-4"].capacity.vram_mib == 40448


def test_ampere_has_no_gpm():
    src = NvmlDeviceSource("gpu-a", nvml=FakeNvml.from_fixture(FIXTURES / "a100-80gb-mig-3g40-2x1g10.json"))
    src.read()
    assert all(d.engine_active_pct is None for d in src.read().gpus[0].mig_devices)
    src.close()


def test_identity_mig_mode_and_cuda_version_are_read():
    snap = _read("h100-sxm5-mig-me-pending.json")
    assert (snap.driver_version, snap.cuda_driver_version) == ("535.129.03", 12020)
    g0, g1 = snap.gpus
    assert (g0.pci_bus_id, g1.pci_bus_id) == ("00000000:18:00.0", "00000000:2A:00.0")
    assert (g0.mig_enabled, g0.mig_pending) == (True, True)
    assert (g1.mig_enabled, g1.mig_pending) == (False, True)  # enable set, waiting for a GPU reset


def test_memory_v2_reports_reserved_apart_from_used():
    """v1's ``used`` includes the driver's reservation; the source asks for v2 and keeps them apart."""
    g0, g1 = _read("h100-sxm5-mig-me-pending.json").gpus
    assert (g1.memory_used_mib, g1.memory_reserved_mib) == (0, 512)
    assert (g0.memory_used_mib, g0.memory_reserved_mib) == (6144, 512)


def test_memory_falls_back_to_v1_on_a_driver_without_v2():
    fx = _fixture("h100-sxm5-mig-me-pending.json")

    class NoV2(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, h, version=None):
            if version is not None:
                raise self.NVMLError(25)  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            return super().nvmlDeviceGetMemoryInfo(h)

    src = NvmlDeviceSource("gpu-a", nvml=NoV2(fx), clock=lambda: 0.0)
    g1 = src.read().gpus[1]
    src.close()
    assert (g1.memory_used_mib, g1.memory_reserved_mib) == (512, 0)


def test_mig_profile_names_are_nvmls_and_keep_me():
    (g0, _) = _read("h100-sxm5-mig-me-pending.json").gpus
    by_gi = {d.gpu_instance_id: d for d in g0.mig_devices}
    assert by_gi[7].profile == "1g.10gb+me" and by_gi[7].gi_profile_id == 20
    assert by_gi[2].profile == "3g.40gb" and by_gi[2].gi_profile_id == 9
    ids = {s.id for s in inventory_from_snapshot(_read("h100-sxm5-mig-me-pending.json"))}
    assert "gpu-a/0/mig-1g.10gb+me-0" in ids


def test_profile_names_are_derived_when_the_driver_cannot_name_them():
    fx = _fixture("h100-sxm5-mig-me-pending.json")
    del fx["devices"][0]["gi_profiles"]  # -> NOT_SUPPORTED, as on a driver without the call
    (g0, _) = _read("", fixture=fx).gpus
    assert sorted(d.profile for d in g0.mig_devices) == ["1g.10gb", "3g.40gb"]
