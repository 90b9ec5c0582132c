"""mig-parted v1 documents (render / parse / validate) and MPS command rendering."""

import pytest

from gpupool.hardware.migparted import MigPartedError, node_layouts, parse_mig_parted, to_mig_parted
from gpupool.hardware.mps import client_env, mps_commands
from gpupool.hardware.planner import plan
from gpupool.hardware.spec import load_cluster_spec, load_workload_spec


def _plan():
    cluster = load_cluster_spec(
        {
            "nodes": [
                {"name": "gpu-a", "gpus": [{"model": "A100-SXM4-80GB", "count": 3}]},
                {"name": "gpu-b", "gpus": [{"model": "L40S-48GB", "uuids": ["GPU-l40s-0"]}]},
            ]
        }
    )
    wl = load_workload_spec(
        {
            "workloads": [
                {
                    "name": "main",
                    "model": "qwen2.5-32b",
                    "quant": "awq",
                    "max_context": 16384,
                    "concurrency": 4,
                    "priority": "P0",
                    "replicas": 2,
                    "isolation": "mig",
                },
                {"name": "guard", "model": "qwen2.5-0.5b", "priority": "P0", "replicas": 2},
            ]
        }
    )
    return plan(cluster, wl)


def test_render_shape_and_grouping():
    doc = to_mig_parted(_plan())
    assert doc["version"] == "v1" and set(doc) == {"version", "mig-configs"}
    a = doc["mig-configs"]["gpupool-gpu-a"]
    assert a[0] == {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}
    assert a[1] == {"devices": [1, 2], "mig-enabled": False}
    assert doc["mig-configs"]["gpupool-gpu-b"] == [{"devices": [0], "mig-enabled": False}]
    assert node_layouts(doc, "gpu-a") == {0: {"3g.40gb": 2}}


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (
            {"version": "v2", "mig-configs": {"x": [{"devices": "all", "mig-enabled": False}]}},
            "unknown version",
        ),
        ({"version": "v1", "mig-configs": {}, "extra": 1}, "extra=1: unknown top-level key"),
        ({"version": "v1", "mig-configs": {}}, "expected a non-empty mapping"),
        ({"version": "v1", "mig-configs": {"x": []}}, "mig-configs.x=[]"),
        (
            {"version": "v1", "mig-configs": {"x": [{"devices": "some", "mig-enabled": True}]}},
            "devices='some'",
        ),
        ({"version": "v1", "mig-configs": {"x": [{"devices": "all"}]}}, "mig-enabled=None"),
        (
            {
                "version": "v1",
                "mig-configs": {"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g": -1}}]},
            },
            "expected {profile: count}",
        ),
    ],
)
def test_parse_rejects(doc, fragment):
    with pytest.raises(MigPartedError) as exc:
        parse_mig_parted(doc, source="f.yaml")
    assert fragment in str(exc.value) and str(exc.value).startswith("f.yaml: ")


def test_parse_accepts_fact_sheet_example():
    doc = {
        "version": "v1",
        "mig-configs": {
            "pool-small-slices": [
                {
                    "device-filter": ["0x20B010DE", "0x20F110DE"],
                    "devices": "all",
                    "mig-enabled": True,
                    "mig-devices": {"1g.5gb": 7},
                },
                {
                    "device-filter": "0x233010DE",
                    "devices": "all",
                    "mig-enabled": True,
                    "mig-devices": {"1g.10gb": 7},
                },
            ],
            "pool-off": [{"devices": "all", "mig-enabled": False}],
        },
    }
    parsed = parse_mig_parted(doc)
    assert parsed["pool-small-slices"][1].device_filter == ("0x233010DE",)


def test_mps_commands():
    p = _plan()
    lines = mps_commands(p)
    text = "\n".join(lines)
    assert "CUDA_VISIBLE_DEVICES=GPU-l40s-0" in text
    assert text.count("nvidia-cuda-mps-control -d") == 1
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in text
    share = next(s for g in p.gpus for s in g.slices if s.workload == "guard")
    env = client_env(share, pipe="/tmp/p")
    assert env == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/p",
    }
