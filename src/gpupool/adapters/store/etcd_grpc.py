"""`GrpcTxn`: a group commit's Txn over etcd's native gRPC API, awaited on an asyncio event loop.

Role: the hot path of `EtcdLeaseStore.apply_async` (the gateway's pipelined group commit). Measured
on the 2-core machine (one etcd 3.5 member on loopback, fsync on, 31-write Txns in a loop): etcd's
JSON gateway costs etcd 4.2-4.4 ms of CPU per Txn and 7.6-8.9 ms wall; the same Txn over gRPC
0.9-1.1 ms and 2.1-2.3 ms. The gateway decodes the JSON body by reflection and calls etcd's own
gRPC server over loopback, so most of its cost is translation. Reads, watch, leases, compaction and
auth stay on the JSON gateway client (`gpupool.adapters.store.etcd_client`), whose endpoints, TLS
files and auth token this reuses. The stubs are generated from a hand-written subset of etcd's
``rpc.proto`` (`gpupool.adapters.store.proto`, see its README). grpcio and protobuf come with the
``k8s`` extra; without them the store sends the same Txn through the JSON gateway
(`gpupool.adapters.store.etcd_aio`).

The Txn request is written straight to its protobuf bytes (`encode_txn`), not built as protobuf
messages: a 24-write group commit has ~75 nested messages. Measured on the 2-core machine (thread
time, best of 9, other jobs running), building and serializing them cost 164-268 us per Txn, the
bytes 91-118 us (the gateway benchmark sends one Txn per ~12 lease round trips). The bytes are
those that ``TxnRequest.SerializeToString`` writes for
the same messages (the unit tests compare the two over random Txns); the answer is still decoded
by the generated ``TxnResponse``.

Invariants:
- one ``grpc.aio`` channel per endpoint and event loop (HTTP/2: concurrent calls share it); a call
  goes to the JSON client's current endpoint;
- the request is built, sent and answered on the calling event loop (grpc's asyncio stack; its
  C core polls the socket): no Python thread runs for a call, and the loop never blocks on etcd.
  The synchronous stack's ``future()`` used before started a Python channel thread whenever calls
  resumed after a pause (the loop waited for it to start) and settled each call from that thread;
  measured on the 2-core machine, 27-write Txns two in flight on uvloop against a local etcd:
  786 -> 551 us of process CPU per Txn (462 -> 410 us on the loop's thread);
- an answered error raises `EtcdError` with its gRPC code and etcd's message; an "invalid auth
  token" answer re-authenticates once and resends (etcd refused it: nothing landed); no answer
  (``timeout_s``, a dropped connection, a channel closed by `close`) raises `EtcdError`
  UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED: the outcome is unknown and the caller treats it as
  such.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from gpupool.adapters.store.etcd_client import GRPC_UNAUTHENTICATED, EtcdClient, EtcdError, KeyValue
from gpupool.adapters.store.proto import etcd_kv_pb2

pb: Any = etcd_kv_pb2  # (generated: untyped)

_TARGETS = {"VERSION": 0, "CREATE": 1, "MOD": 2, "VALUE": 3, "LEASE": 4}
_FIELDS = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}
TXN_METHOD = "/etcdserverpb.KV/Txn"

Cmp = tuple[bytes, str, int | bytes]
"""(key, target, value): ``target`` VERSION | CREATE | MOD | LEASE (an int) or VALUE (bytes), EQUAL."""


class GrpcTxn:
    def __init__(self, client: EtcdClient) -> None:
        self.client = client
        self._stubs: dict[tuple[int, asyncio.AbstractEventLoop], tuple[grpc.aio.Channel, Any]] = {}

    def _stub(self, at: int) -> Any:
        """The Txn method of endpoint ``at`` on the running loop (a grpc.aio channel belongs to one
        loop), sending request bytes as they are (`encode_txn`)."""
        loop = asyncio.get_running_loop()
        got = self._stubs.get((at, loop))
        if got is None:
            target = self.client.urls[at].split("://", 1)[1]
            files = self.client.tls_files
            if files is None:
                channel = grpc.aio.insecure_channel(target)
            else:
                cacert, cert, key = (None if f is None else Path(f).read_bytes() for f in files)
                creds = grpc.ssl_channel_credentials(cacert, key, cert)
                channel = grpc.aio.secure_channel(target, creds)
            method = channel.unary_unary(
                TXN_METHOD, request_serializer=None, response_deserializer=pb.TxnResponse.FromString
            )
            got = self._stubs[(at, loop)] = (channel, method)
        return got[1]

    async def txn(
        self, compares: list[Cmp], puts: list[tuple[bytes, bytes]], reads: list[bytes]
    ) -> tuple[bool, list[list[KeyValue]], int]:
        """One Txn: (succeeded, per failure-branch read its key-values, the revision after it)."""
        req = encode_txn(compares, puts, reads)
        retried_auth = False
        while True:
            try:
                resp = await self._call(req)
            except grpc.RpcError as exc:
                err: Any = exc
                code = err.code().value[0] if err.code() is not None else 14
                message = err.details() or str(err.code())
                c = self.client
                if (
                    (code == GRPC_UNAUTHENTICATED or "invalid auth token" in message)
                    and c._user is not None
                    and not retried_auth
                ):
                    retried_auth = True
                    c._authenticate()  # (rare: blocks the loop for one round trip)
                    continue
                raise EtcdError(f"etcd Txn ({c.urls[c._current]}): {message}", code=code) from None
            ranges = (
                [[_kv(kv) for kv in r.response_range.kvs] for r in resp.responses]
                if not resp.succeeded
                else []
            )
            return bool(resp.succeeded), ranges, int(resp.header.revision)

    async def _call(self, req: bytes) -> Any:
        c = self.client
        md = (("token", c._token),) if c._token else None
        return await self._stub(c._current)(req, timeout=c.timeout_s, metadata=md)

    def close(self) -> None:
        """Close every channel (cancelling what is in flight on it) on its own loop while that loop
        runs; a channel whose loop has ended closes itself when dropped (grpc.aio's finaliser)."""
        stubs, self._stubs = self._stubs, {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for (_, loop), (channel, _) in stubs.items():
            if loop is here:
                loop.create_task(channel.close())
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(channel.close(), loop)


def _compare(key: bytes, target: str, value: int | bytes) -> Any:
    """The same compare as a protobuf message (the reference `encode_txn` is checked against)."""
    if target == "VALUE":
        return pb.Compare(result=0, target=3, key=key, value=value)
    return pb.Compare(result=0, target=_TARGETS[target], key=key, **{_FIELDS[target]: value})


# ---------------------------------------------------------------------- protobuf bytes
# Tags are (field number << 3) | wire type (0: varint, 2: length-delimited); fields are written in
# field-number order, a proto3 scalar at its default is left out unless it is set in a oneof.
_UNION_TAG = {"VERSION": 0x20, "CREATE": 0x28, "MOD": 0x30, "LEASE": 0x40}
"""Compare.target_union: version = 4, create_revision = 5, mod_revision = 6, lease = 8 (varints)."""
_U64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    """A protobuf varint; a negative int64 as its 64-bit two's complement (10 bytes)."""
    if 0 <= n < 0x4000:
        return _SHORT[n]
    if 0 <= n < 0x10000000:  # (a revision: three or four bytes)
        low = bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80))
        return low + (bytes((n >> 14,)) if n < 0x200000 else bytes(((n >> 14) & 0x7F | 0x80, n >> 21)))
    n &= _U64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SHORT = [bytes((n,)) for n in range(0x80)] + [
    bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(0x80, 0x4000)
]
"""The varints of 0 .. 16383 (one or two bytes): every length and most revisions of a Txn."""


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte, the payload's length, the payload."""
    n = len(payload)
    return tag + (_SHORT[n] if n < 0x4000 else _varint(n)) + payload


def _compare_bytes(key: bytes, target: str, value: int | bytes) -> bytes:
    # result EQUAL (0) is the default: left out; target VERSION (0) too
    key_f = _field(b"\x1a", key) if key else b""
    if target == "VALUE":
        assert isinstance(value, bytes)
        return b"\x10\x03" + key_f + _field(b"\x3a", value)
    assert isinstance(value, int)
    code = _TARGETS[target]
    head = b"\x10" + bytes((code,)) if code else b""
    return head + key_f + bytes((_UNION_TAG[target],)) + _varint(value)


def encode_txn(compares: list[Cmp], puts: list[tuple[bytes, bytes]], reads: list[bytes]) -> bytes:
    """``TxnRequest(compare=..., success=[put ...], failure=[range ...])`` as protobuf bytes: each
    compare ``(key, target, value)`` with result EQUAL, each put ``(key, value)`` a ``PutRequest``,
    each read a ``RangeRequest`` of one key. The bytes ``SerializeToString`` writes for them."""
    short, field = _SHORT, _field
    parts = [field(b"\x0a", _compare_bytes(k, t, v)) for k, t, v in compares]
    for k, v in puts:  # RequestOp.request_put = 2 { key = 1, value = 2 }
        if 0 < len(k) < 0x80 and 0 < len(v) < 0x4000 - 0x100:  # (lengths in one or two bytes)
            put = b"\x0a" + short[len(k)] + k + b"\x12" + short[len(v)] + v
            op = b"\x12" + short[len(put)] + put
            parts.append(b"\x12" + short[len(op)] + op)
            continue
        put = (field(b"\x0a", k) if k else b"") + (field(b"\x12", v) if v else b"")
        parts.append(field(b"\x12", field(b"\x12", put)))
    for k in reads:  # RequestOp.request_range = 1 { key = 1 }
        if 0 < len(k) < 0x7C:  # (every length below in one byte)
            parts.append(
                b"\x1a" + short[len(k) + 4] + b"\x0a" + short[len(k) + 2] + b"\x0a" + short[len(k)] + k
            )
            continue
        parts.append(field(b"\x1a", field(b"\x0a", field(b"\x0a", k) if k else b"")))
    return b"".join(parts)


def _kv(kv: Any) -> KeyValue:
    return KeyValue(
        key=kv.key,
        value=kv.value,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


__all__ = ["Cmp", "GrpcTxn", "encode_txn"]
