"""The checked-in generated gRPC code equals what the pinned generator produces, and matches the runtime."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "src" / "gpupool" / "adapters" / "k8s" / "proto"
PROTOS = ["deviceplugin_v1beta1.proto", "podresources_v1.proto"]


def test_generated_code_is_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        str(ROOT / "src"),
        f"--python_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        *(str(PROTO_DIR / p) for p in PROTOS),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    for proto in PROTOS:
        stem = proto.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            fresh = (tmp_path / "gpupool" / "adapters" / "k8s" / "proto" / f"{stem}{suffix}").read_text()
            assert (PROTO_DIR / f"{stem}{suffix}").read_text() == fresh, (
                f"regenerate {stem}{suffix} (README.md)"
            )


def test_generated_code_matches_the_pinned_runtime() -> None:
    from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
    from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2_grpc as pbg

    assert version("grpcio") == pbg.GRPC_GENERATED_VERSION == "1.85.1"
    assert version("protobuf") == "7.36.2"
    assert pb.DESCRIPTOR.package == "v1beta1"


def test_wire_names_and_numbers_match_kubelet() -> None:
    from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb

    def fields(msg: object) -> dict[str, int]:
        return {f.name: f.number for f in msg.DESCRIPTOR.fields}  # type: ignore[attr-defined]

    assert fields(pb.RegisterRequest) == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert fields(pb.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert fields(pb.NUMANode) == {"ID": 1}
    assert fields(pb.ContainerAllocateRequest) == {"devices_ids": 1}
    assert fields(pb.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert fields(pb.ContainerPreferredAllocationResponse) == {"deviceIDs": 1}
    assert fields(pb.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert fields(pb.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert fields(pb.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert fields(pb.DevicePluginOptions) == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }
    services = {s.name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
