"""The slice lists node agents publish (``PUT /v1/nodes/{node}/slices``), kept in the lease store.

Role: the agent is the truth about its node's slices, and the pool holds them in memory. A lease
on a slice that the cluster spec does not name (a node that joined after the plan, a GPU its agent
found in another shape) would otherwise be revoked as "not restorable" by the recovery of a
restarted gateway (or of a new leader), before the agent publishes again. So each node's accepted
list is also written to the store's meta key `NODE_SLICES_META` when it changes, and `recover_pool`
applies the stored lists before it recovers the leases.

Invariants: the stored entry of a node is the last list accepted for it (the `NodeSliceIn`
fields); a write that fails is retried at the node's next publication (the pool in memory is
current meanwhile); a stored entry that no longer applies (damaged, or naming a GPU that the
cluster spec now gives another node) is skipped, and that node's agent corrects it when it
publishes again (every ``--resync-s``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpupool.adapters.http.context import Gateway
from gpupool.adapters.http.schemas import NodeSliceIn
from gpupool.core.controller import LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.ports import RecoveryReport
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

NODE_SLICES_META = "node_slices"
"""Store meta key: JSON ``{node: [slice, ...]}``, each slice with the `NodeSliceIn` fields."""


def to_slices(node: str, items: Sequence[NodeSliceIn]) -> list[Slice]:
    """The pool's slices of ``node`` for a published list; `InvalidInput` for an inconsistent one."""
    try:
        return [
            Slice(
                id=x.id,
                node=node,
                gpu_id=x.gpu_id,
                kind=SliceKind(x.kind),
                capacity=Resources(x.vram_mib, x.compute_milli),
                healthy=x.healthy,
                gpu_index=x.index,
                gpu_model=x.model,
                profile=x.profile,
                uuid=x.uuid,
            )
            for x in items
        ]
    except ValueError as exc:
        raise InvalidInput("slices", node, str(exc)) from None


def stored_node_slices(controller: LeaseController) -> dict[str, list[Any]]:
    """The stored lists by node (``{}`` for none, a damaged value or a store that cannot be read)."""
    try:
        text = controller.store.get_meta(NODE_SLICES_META)
        doc = json.loads(text) if text else {}
    except Exception:  # (a damaged hint: the agents publish again within --resync-s)
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(node): items for node, items in doc.items() if isinstance(items, list)}


def remember(gw: Gateway, node: str, items: Sequence[NodeSliceIn]) -> None:
    """Store ``node``'s accepted list when it differs from the stored one."""
    records = [x.model_dump() for x in items]
    known = gw.node_slices if gw.node_slices is not None else stored_node_slices(gw.controller)
    if known.get(node) == records:
        gw.node_slices = known
        return
    doc = {**known, node: records}
    gw.node_slices = None  # until written: the next publication compares with the store again
    try:
        gw.controller.store.set_meta(NODE_SLICES_META, json.dumps(doc, sort_keys=True))
    except Exception:  # (the pool in memory is current; the node's next publication writes it)
        return
    gw.node_slices = doc


def recover_pool(controller: LeaseController) -> RecoveryReport:
    """Apply the stored slice lists, then recover the leases (`LeaseController.recover`)."""
    for node, items in sorted(stored_node_slices(controller).items()):
        try:
            slices = to_slices(node, [NodeSliceIn.model_validate(x) for x in items])
            controller.sync_node(node, slices)
        except ValueError:  # (InvalidInput and pydantic's ValidationError are ValueErrors)
            continue
    return controller.recover()
