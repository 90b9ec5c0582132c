"""Slices for the extender: a static pool from a parsed cluster spec, or the cluster's node annotations.

Static pool (``gpupool extender --cluster FILE`` without workloads): every card is one WHOLE slice of
the model's full memory and 1000 mGPU. The spec shape is ``{"nodes": [{"name", "gpus": [{"model",
"count"}]}]}`` (already parsed from YAML by the CLI). Card memory comes from the hardware catalogue
(`gpupool.hardware.catalogue.gpu_model`); a ``memory_mib`` key on a GPU entry overrides it.

Slice ids are ``<node>/gpu<index>`` (index counts the node's cards in spec order); ``gpu_id`` equals
the slice id for whole cards. Live pool: `slices_from_nodes` decodes each node's
``<domain>/slices`` annotation (see `annotations`); a node with a bad annotation is skipped and its
reason returned, so one broken agent never hides the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpupool.adapters.k8s.annotations import decode_slices
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, ResourceNames
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources


def card_memory_mib(model: str, field: str) -> int:
    from gpupool.hardware.catalogue import gpu_model

    try:
        return gpu_model(model).memory_mib
    except ValueError as exc:
        raise InvalidInput(field, model, str(exc)) from None


def whole_gpu_slices(spec: object) -> list[Slice]:
    """One WHOLE slice per card of a parsed cluster spec. Raises `InvalidInput` naming the field."""
    if not isinstance(spec, dict):
        raise InvalidInput("cluster", type(spec).__name__, "must be a mapping with a 'nodes' list")
    nodes = spec.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise InvalidInput("cluster.nodes", nodes, "must be a non-empty list")
    out: list[Slice] = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        nf = f"cluster.nodes[{i}]"
        if not isinstance(node, dict):
            raise InvalidInput(nf, node, "must be a mapping with name and gpus")
        name = node.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{nf}.name", name, "must be a non-empty string")
        if name in seen:
            raise InvalidInput(f"{nf}.name", name, "duplicate node name")
        seen.add(name)
        gpus = node.get("gpus")
        if not isinstance(gpus, list) or not gpus:
            raise InvalidInput(f"{nf}.gpus", gpus, "must be a non-empty list of {model, count}")
        index = 0
        for j, g in enumerate(gpus):
            gf = f"{nf}.gpus[{j}]"
            if not isinstance(g, dict) or not isinstance(g.get("model"), str):
                raise InvalidInput(f"{gf}.model", g, "must be a GPU model name")
            count = g.get("count", 1)
            if type(count) is not int or not 1 <= count <= 64:
                raise InvalidInput(f"{gf}.count", count, "must be an integer in [1, 64]")
            mem = g.get("memory_mib")
            if mem is None:
                mem = card_memory_mib(g["model"], f"{gf}.model")
            elif type(mem) is not int or mem <= 0:
                raise InvalidInput(f"{gf}.memory_mib", mem, "must be a positive integer")
            for _ in range(count):
                sid = f"{name}/gpu{index}"
                out.append(
                    Slice(
                        id=sid,
                        node=name,
                        gpu_id=sid,
                        kind=SliceKind.WHOLE,
                        capacity=Resources(mem, COMPUTE_MILLI_PER_GPU),
                        gpu_index=index,
                        gpu_model=g["model"],
                    )
                )
                index += 1
    return out


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
