"""`PipelinedCommits`: the etcd store's group commits sent from an asyncio event loop, several in
flight at once, chained inside etcd so that what lands is always a prefix of what was sent.

Role: a mixin of `gpupool.adapters.store.etcd.EtcdLeaseStore` (which builds each Txn, `_build`, and
learns from etcd's answer, `_settle`); the gateway's pipelined `GroupCommitter`
(`gpupool.adapters.http.runtime`) is its caller. Also the wire-independent shape of one Txn.

The chain (invariants):
- every call puts this store object's commit key ``PREFIX commit/<instance>`` to a token of its
  own (``<instance>:<sequence>``), in the same Txn as its writes;
- a call made while the previous one is in flight (``after``) also compares that key with the
  previous call's token, so etcd applies it only if, and only after, the previous one landed;
- if it reached etcd first (only the chain compare failed), it waits for the previous one and is
  sent again once that one landed; if the previous one failed, it raises `CommitChainBroken` and
  nothing of it landed;
- the key is deleted by `EtcdLeaseStore.close`; a process killed leaves one short key behind.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpupool.adapters.store.etcd_client import (
    GRPC_FAILED_PRECONDITION,
    GRPC_INVALID_ARGUMENT,
    EtcdClient,
    EtcdError,
    KeyValue,
    compare,
    compare_value,
    put_op,
    range_op,
)
from gpupool.core.errors import StoreUnreachable
from gpupool.core.model import Lease
from gpupool.core.ports import Write

if TYPE_CHECKING:
    from gpupool.adapters.store.etcd_aio import AsyncGateway
    from gpupool.adapters.store.etcd_grpc import GrpcTxn


class CommitChainBroken(StoreUnreachable):
    """A pipelined commit was not applied because the commit it was chained to failed."""


class _ChainPending(Exception):
    """A chained Txn failed on its chain compare alone: its predecessor had not landed (yet)."""


@dataclass(frozen=True, slots=True)
class _Chain:
    key: bytes
    token: bytes
    after: bytes | None
    """The token the previous in-flight commit puts (compared), or None: not chained."""


Cmp = tuple[bytes, str, int | bytes]
"""(key, target, value): target VERSION | CREATE | MOD | LEASE (an int) or VALUE (bytes), EQUAL."""


@dataclass(frozen=True, slots=True)
class _Txn:
    """One group commit's Txn, independent of the wire (JSON gateway or gRPC)."""

    leases: dict[str, tuple[int | None, Lease]]
    expected_mod: dict[str, int | None]
    compares: list[Cmp]
    puts: list[tuple[bytes, bytes]]
    reads: list[bytes]
    """The failure branch: a range read per compared lease (then the chain key)."""
    chain: _Chain | None


def _json_compare(c: Cmp) -> dict[str, Any]:
    key, target, value = c
    return compare_value(key, value) if isinstance(value, bytes) else compare(key, target, value)


def _json_ranges(ok: bool, responses: list[dict[str, Any]]) -> list[list[KeyValue]]:
    if ok:
        return []
    return [[KeyValue.from_json(kv) for kv in r.get("response_range", {}).get("kvs", ())] for r in responses]


class PipelinedCommits:
    """`apply_async` for `EtcdLeaseStore` (see the module docstring)."""

    client: EtcdClient
    on_write_doubt: Callable[[EtcdError], None] | None
    _lock: threading.Lock
    _instance: str
    _chain_seq: int
    _chain_last: bytes
    _aio: AsyncGateway | GrpcTxn | None
    wire: str
    """How `apply_async` sends: grpc (etcd's native API; the JSON gateway when grpcio is not
    installed) or json (the JSON gateway). The store's other calls always use the JSON gateway."""

    def _key(self, kind: str, ident: str) -> bytes:
        raise NotImplementedError

    def _build(self, writes: Sequence[Write], chain: _Chain | None) -> _Txn:
        raise NotImplementedError

    def _settle(self, txn: _Txn, ok: bool, ranges: list[list[KeyValue]], revision: int) -> None:
        raise NotImplementedError

    def apply_async(
        self, writes: Sequence[Write], *, after: asyncio.Future[Any] | None = None
    ) -> Coroutine[Any, Any, None]:
        """`apply` from an asyncio event loop, without blocking it while etcd commits, and with
        several calls in flight at once (the pipelined group commit of `gpupool.adapters.http.runtime`).

        The Txn is built now (in call order: that order is the chain's); the returned coroutine
        sends it and raises why it failed, if it did. ``after``: the task of the call made just
        before this one, while it is still in flight, or None. This Txn is then chained to it: it
        also compares this store's commit key (``PREFIX commit/<instance>``, which every call puts
        to its own sequence token) with the token ``after`` puts, so it lands only if, and only
        after, ``after`` landed. If it reached etcd first (the chain compare alone failed), it
        waits for ``after`` and is sent again; if ``after`` fails, it raises `CommitChainBroken`
        and lands nothing. Calls touching the same lease must not be in flight together (the
        compare needs the mod_revision the first one makes): the caller waits. Errors as `apply`
        (`on_write_doubt` included); after an unknown outcome (`EtcdError`, UNAVAILABLE) the Txn
        may have landed, and so may the calls chained to it."""
        try:
            with self._lock:
                if not writes:
                    return _done()
                self._chain_seq += 1
                token = f"{self._instance}:{self._chain_seq}".encode()
                chain = _Chain(
                    self._key("commit", self._instance), token, self._chain_last if after else None
                )
                self._chain_last = token
                txn = self._build(writes, chain)
        except Exception as exc:
            return _fail(exc)
        return self._send(txn, after)

    async def _send(self, txn: _Txn, after: asyncio.Future[Any] | None) -> None:
        send = self._wire()
        resent = False
        while True:
            try:
                ok, ranges, revision = await send(txn)
            except EtcdError as exc:
                if self.on_write_doubt is not None and exc.code != GRPC_INVALID_ARGUMENT:
                    self.on_write_doubt(exc)
                raise
            with self._lock:
                try:
                    self._settle(txn, ok, ranges, revision)
                    return
                except _ChainPending:
                    if after is None or resent:
                        key = txn.chain.key.decode() if txn.chain else ""
                        raise EtcdError(
                            f"etcd key {key!r} was changed by another writer: the write was not applied",
                            code=GRPC_FAILED_PRECONDITION,
                        ) from None
            await asyncio.wait([after])  # it reached etcd after this one: wait for its outcome
            if after.cancelled() or after.exception() is not None:
                raise CommitChainBroken("an earlier group commit failed: this one was not applied")
            resent = True

    def _wire(self) -> Callable[[_Txn], Awaitable[tuple[bool, list[list[KeyValue]], int]]]:
        """How `apply_async` sends a Txn: etcd's native gRPC API when grpcio is installed
        (`gpupool.adapters.store.etcd_grpc`), else the JSON gateway from the loop (`etcd_aio`)."""
        if self._aio is None:
            if self.wire == "grpc":
                try:
                    from gpupool.adapters.store.etcd_grpc import GrpcTxn
                except ImportError:
                    self.wire = "json"
                    logging.getLogger(__name__).warning(
                        "grpcio is not installed: etcd group commits use etcd's JSON gateway, about 4x"
                        " more etcd CPU per commit (install the extra: pip install 'gpupool[etcd]')"
                    )
                else:
                    self._aio = GrpcTxn(self.client)
            if self._aio is None:
                from gpupool.adapters.store.etcd_aio import AsyncGateway

                self._aio = AsyncGateway(self.client)
        aio = self._aio
        if self.wire == "grpc":

            async def send_grpc(txn: _Txn) -> tuple[bool, list[list[KeyValue]], int]:
                return await aio.txn(txn.compares, txn.puts, txn.reads)  # type: ignore[union-attr]

            return send_grpc

        async def send_json(txn: _Txn) -> tuple[bool, list[list[KeyValue]], int]:
            body = {
                "compare": [_json_compare(c) for c in txn.compares],
                "success": [put_op(k, v) for k, v in txn.puts],
                "failure": [range_op(k) for k in txn.reads],
            }
            out = await aio.call("/v3/kv/txn", body)  # type: ignore[union-attr]
            ok = bool(out.get("succeeded", False))
            return ok, _json_ranges(ok, list(out.get("responses", ()))), int(out["header"]["revision"])

        return send_json


async def _done() -> None:
    return None


async def _fail(exc: Exception) -> None:
    raise exc
