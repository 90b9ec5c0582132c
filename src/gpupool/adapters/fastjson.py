"""JSON encoding on the adapters' hot paths: orjson where it is installed, the standard library where not.

Role: every lease round trip encodes each lease twice in JSON (the stored record, sorted keys, and
the HTTP answer); with the standard library that was about 20 us of the gateway's event-loop time
per lease round trip, with orjson (a C extension made for the job, in the ``gateway`` and ``etcd``
extras) about 3. The core keeps its standard-library encoders (`gpupool.core.ports.encode_lease`);
this module only encodes the same dictionaries faster.

Invariants:
- the output is JSON that the standard library's ``json.loads`` decodes to the same value as
  ``json.dumps`` of the same object would: compact separators, keys sorted where asked, non-ASCII
  text as UTF-8 rather than ``\\u`` escapes (same value), floats in their shortest round-trip form;
- what orjson refuses (integers beyond 64 bits, non-string keys other than ints, unknown types)
  falls back to the standard library, so no value encodes differently than it did before orjson;
- NaN and infinities: orjson writes them as ``null`` where the standard library writes ``NaN``
  (stored records) or refuses them (HTTP answers). Neither reaches these encoders: the core refuses
  non-finite numbers at its edge (`gpupool.core.model.validate_request`, the API schemas), and its
  clock and TTLs are finite.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from gpupool.core.model import Lease
from gpupool.core.ports import TicketRecord, lease_to_dict, ticket_to_dict

try:
    from orjson import OPT_SORT_KEYS
    from orjson import dumps as _fast_dumps
except ImportError:  # (the core-only install: no extras)
    OPT_SORT_KEYS, _fast_dumps = 0, None  # type: ignore[assignment]


def dumps(obj: Any, *, sort_keys: bool = False) -> bytes:
    """``obj`` as compact UTF-8 JSON (``sort_keys``: keys in sorted order, as stored records are)."""
    if _fast_dumps is not None:
        try:
            return _fast_dumps(obj, option=OPT_SORT_KEYS if sort_keys else 0)
        except TypeError:
            pass  # (orjson.JSONEncodeError is a TypeError: big ints, int keys, unknown types)
    return json.dumps(
        obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=sort_keys
    ).encode("utf-8")


def lease_record(lease: Lease) -> bytes:
    """A lease as a store keeps it: what `gpupool.core.ports.encode_lease` writes, encoded faster.

    With orjson, the object is built with its keys already in sorted order at every level (the
    order ``lease_to_dict`` + ``sort_keys`` gives) and written as it is: one dictionary per level
    instead of two, no sort (each lease is written at least twice per round trip: grant, end).
    The bytes are those of ``dumps(lease_to_dict(lease), sort_keys=True)`` (unit-tested)."""
    if _fast_dumps is not None:
        with contextlib.suppress(TypeError):  # (what orjson refuses, see `dumps`: the fallback)
            return _fast_dumps(_sorted_lease(lease))
    return dumps(lease_to_dict(lease), sort_keys=True)


def _sorted_lease(lease: Lease) -> dict[str, Any]:
    """`lease_to_dict` with its keys in sorted order at every level."""
    r = lease.request
    demand = r.demand
    return {
        "ended_at": lease.ended_at,
        "expires_at": lease.expires_at,
        "granted_at": lease.granted_at,
        "grants": [
            {
                "compute_milli": g.resources.compute_milli,
                "gpu_id": g.gpu_id,
                "slice_id": g.slice_id,
                "vram_mib": g.resources.vram_mib,
            }
            for g in lease.grants
        ],
        "id": lease.id,
        "node": lease.node,
        "reason": lease.reason,
        "request": {
            "compute_milli": demand.compute_milli,
            "gpu_count": r.gpu_count,
            "id": r.id,
            "kinds": sorted(k.value for k in r.kinds) if r.kinds else [],
            "labels": [list(kv) for kv in r.labels],
            "model": r.model,
            "nodes": sorted(r.nodes) if r.nodes else [],
            "preemptible": r.preemptible,
            "priority": r.priority,
            "tenant": r.tenant,
            "ttl_s": r.ttl_s,
            "vram_mib": demand.vram_mib,
        },
        "revision": lease.revision,
        "state": lease.state.value,
    }


def ticket_record(ticket: TicketRecord) -> bytes:
    """A ticket as a store keeps it: what `gpupool.core.ports.encode_ticket` writes, encoded faster."""
    return dumps(ticket_to_dict(ticket), sort_keys=True)


__all__ = ["dumps", "lease_record", "ticket_record"]
