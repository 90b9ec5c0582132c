"""Slices for the extender from the cluster itself: each node's ``<domain>/slices`` annotation.

The node agent writes the annotation (see `annotations` for the versioned shape); the extender reads
every node at start and on resync. A node with a bad annotation is skipped and its reason returned,
so one broken agent never hides the others; `sync_from_nodes` applies later changes (new, changed,
vanished slices, health) to a running pool. Static pools come from the hardware layer instead:
``inventory_from_cluster`` (one WHOLE slice per card) or ``inventory_from_plan`` (the planned layout).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpupool.adapters.k8s.annotations import decode_slices
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, ResourceNames
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import Slice


def slices_from_nodes(
    nodes: Iterable[dict[str, Any]], names: ResourceNames = DEFAULT_NAMES
) -> tuple[list[Slice], dict[str, str]]:
    """Slices from node objects (JSON dicts); returns (slices, {node: why it was skipped})."""
    out: list[Slice] = []
    skipped: dict[str, str] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        text = (meta.get("annotations") or {}).get(names.slices)
        if not name or text is None:
            continue
        try:
            out.extend(decode_slices(text, node=name, field=f"node {name} annotation {names.slices}"))
        except InvalidInput as exc:
            skipped[name] = str(exc)
    return out, skipped


def sync_from_nodes(
    pool: ExtenderPool, nodes: list[dict[str, Any]], names: ResourceNames = DEFAULT_NAMES
) -> dict[str, list[str]]:
    """Bring the pool in line with the nodes' annotations (see `ExtenderPool.sync_slices`).

    In scope: every node with a readable annotation, and pool nodes that are no longer listed at
    all (deleted nodes). A node whose annotation does not decode keeps its old slices.
    """
    slices, skipped = slices_from_nodes(nodes, names)
    listed = {str((n.get("metadata") or {}).get("name") or "") for n in nodes}
    annotated = {
        str((n.get("metadata") or {}).get("name") or "")
        for n in nodes
        if names.slices in ((n.get("metadata") or {}).get("annotations") or {})
    }
    scope = (annotated - set(skipped)) | (set(pool.nodes()) - listed)
    report = pool.sync_slices(slices, nodes=scope)
    report["skipped"] = sorted(skipped)
    return report
