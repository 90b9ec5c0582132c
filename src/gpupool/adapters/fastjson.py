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
    """A lease as a store keeps it: what `gpupool.core.ports.encode_lease` writes, encoded faster."""
    return dumps(lease_to_dict(lease), sort_keys=True)


def ticket_record(ticket: TicketRecord) -> bytes:
    """A ticket as a store keeps it: what `gpupool.core.ports.encode_ticket` writes, encoded faster."""
    return dumps(ticket_to_dict(ticket), sort_keys=True)


__all__ = ["dumps", "lease_record", "ticket_record"]
