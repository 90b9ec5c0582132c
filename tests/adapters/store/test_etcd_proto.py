"""The checked-in etcd gRPC stubs equal what the pinned generator produces from `etcd_kv.proto`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_the_txn_method_path_is_the_services_own() -> None:
    pytest.importorskip("grpc")
    from gpupool.adapters.store.etcd_grpc import TXN_METHOD
    from gpupool.adapters.store.proto import etcd_kv_pb2 as pb

    method = pb.DESCRIPTOR.services_by_name["KV"].methods_by_name["Txn"]
    assert f"/{method.containing_service.full_name}/{method.name}" == TXN_METHOD


_keys = st.one_of(st.binary(max_size=40), st.integers(100, 200).map(lambda n: b"k" * n))
_values = st.one_of(st.binary(max_size=600), st.integers(16_000, 16_600).map(lambda n: b"v" * n))
_ints = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**30),  # (revisions: the short varints)
)
_cmps = st.one_of(
    st.tuples(_keys, st.sampled_from(["VERSION", "CREATE", "MOD", "LEASE"]), _ints),
    st.tuples(_keys, st.just("VALUE"), _values),
)


@settings(max_examples=400, deadline=None)
@given(
    compares=st.lists(_cmps, max_size=8),
    puts=st.lists(st.tuples(_keys, _values), max_size=8),
    reads=st.lists(_keys, max_size=8),
)
def test_encode_txn_writes_the_bytes_protobuf_writes(
    compares: list[tuple[bytes, str, int | bytes]], puts: list[tuple[bytes, bytes]], reads: list[bytes]
) -> None:
    """The Txn sent to etcd as hand-written bytes is byte for byte the protobuf message it replaced
    (the empty key, value and zero revision included: proto3 leaves defaults out, but not in a oneof)."""
    pytest.importorskip("grpc")
    from gpupool.adapters.store.etcd_grpc import _compare, encode_txn
    from gpupool.adapters.store.proto import etcd_kv_pb2 as pb

    ref = pb.TxnRequest(
        compare=[_compare(k, t, v) for k, t, v in compares],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=v)) for k, v in puts],
        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in reads],
    )
    got = encode_txn(compares, puts, reads)
    assert got == ref.SerializeToString()
    assert pb.TxnRequest.FromString(got) == ref
