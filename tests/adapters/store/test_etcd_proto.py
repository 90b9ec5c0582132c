"""The checked-in etcd gRPC stubs equal what the pinned generator produces from `etcd_kv.proto`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "src" / "gpupool" / "adapters" / "store" / "proto"


def test_generated_code_is_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "src")]
    cmd += [f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(PROTO_DIR / "etcd_kv.proto")]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    for suffix in ("_pb2.py", "_pb2_grpc.py"):
        fresh = (tmp_path / "gpupool" / "adapters" / "store" / "proto" / f"etcd_kv{suffix}").read_text()
        assert (PROTO_DIR / f"etcd_kv{suffix}").read_text() == fresh, (
            f"regenerate etcd_kv{suffix} (README.md)"
        )


def test_the_stub_calls_etcds_own_method_path() -> None:
    pytest.importorskip("grpc")
    from gpupool.adapters.store.proto import etcd_kv_pb2 as pb

    assert pb.DESCRIPTOR.package == "etcdserverpb"
    assert pb.DESCRIPTOR.services_by_name["KV"].methods_by_name["Txn"].full_name == "etcdserverpb.KV.Txn"
