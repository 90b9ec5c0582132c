"""Cluster and workload specs, parsed from plain dicts (YAML/JSON loading lives in ``gpupool.cli.specfiles``).

Role: validate user input once, at the edge, into frozen values the planner trusts.

Public API:
- ``load_cluster_spec(data, *, source="cluster")`` -> ``ClusterSpec`` (``nodes``; ``gpus()`` lists every
  card as a ``GpuSpec`` with ``node``, ``index``, ``model``, ``mode``, ``uuid``, ``gpu_id`` = "node/index").
- ``load_workload_spec(data, *, source="workloads", base_dir=None)`` -> ``WorkloadSet`` of ``WorkloadSpec``
  (``need_mib`` per replica is resolved here: ``vram_mib`` if given, else the memory estimate).
- ``SpecError``: a ``ValueError`` whose one-line message names the source file, the dotted key and the
  value, e.g. ``cluster.yaml: nodes[0].gpus[0].model='A100-FOO': unknown GPU model (known: ...)``.

Cluster keys: ``nodes[].name``, ``nodes[].gpus[]`` = ``{model, count=1, mode?, uuids?}`` or a model string,
``nodes[].labels?``. Workload keys: ``workloads[].name`` (unique), ``model`` or ``vram_mib``, ``priority``
(P0|P1|P2), ``replicas`` (1), ``max_context``, ``concurrency`` (1), ``isolation`` (any|mig|mps),
``quant`` (bf16), ``kv_dtype`` (bf16), ``kv_tokens``, ``compute_pct`` (1-100), ``role`` (llm|guardrail|
embedding|rerank|batch; inferred when absent).

Invariants:
- Unknown keys are errors (typos never pass silently); node names, GPU ids and workload names are unique.
- Every error message is one line and starts with ``source``, and is short: the value is shown
  abridged (`shown`), so a huge value (a long string, a YAML alias "billion laughs" structure) costs
  no more to report than a small one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpupool.hardware.abridge import abridger
from gpupool.hardware.capability import GpuMode
from gpupool.hardware.catalogue import GpuModel, UnknownGpuModelError, gpu_model, known_gpu_models
from gpupool.hardware.memory import KV_DTYPE_BYTES, QUANT_BYTES, estimate, resolve_model
from gpupool.hardware.models import BadModelConfigError, ModelArch, UnknownModelError, known_models

PRIORITY_VALUES = {"P0": 100, "P1": 50, "P2": -1}
"""Same integers as ``gpupool.core.priority`` (hardware cannot import core)."""

MAX_REPLICAS = 1024
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")

shown = abridger(items=4, chars=80, levels=2)
"""``repr(value)``, abridged with ``...`` past a few items, levels or characters: its cost is bounded
whatever the value (aliases let a small YAML file hold a structure of 10**9 items)."""


class SpecError(ValueError):
    def __init__(self, source: str, key: str, value: object, reason: str) -> None:
        self.source, self.key, self.value, self.reason = source, key, value, reason
        if key:
            text = f"{source}: {key}={shown(value)}: {reason}"
        else:
            text = f"{source}: top level: {reason}, got {type(value).__name__}"
        super().__init__(" ".join(text.split()))


class Isolation(StrEnum):
    ANY = "any"
    MIG = "mig"
    MPS = "mps"


class Role(StrEnum):
    LLM = "llm"
    """Main reasoning LLM: prefers a hard-isolated MIG slice."""
    GUARDRAIL = "guardrail"
    """Small intent / guardrail decoder: prefers an MPS share."""
    EMBEDDING = "embedding"
    RERANK = "rerank"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class GpuGroupSpec:
    model: GpuModel
    count: int
    mode: GpuMode | None = None
    uuids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuGroupSpec, ...]
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One physical card of the cluster."""

    node: str
    index: int
    model: GpuModel
    mode: GpuMode | None = None
    uuid: str = ""

    @property
    def gpu_id(self) -> str:
        return f"{self.node}/{self.index}"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    source: str = "cluster"

    def gpus(self) -> tuple[GpuSpec, ...]:
        """Every card, node order then index order (indices count across a node's groups)."""
        out: list[GpuSpec] = []
        for node in self.nodes:
            i = 0
            for g in node.gpus:
                for k in range(g.count):
                    uuid = g.uuids[k] if k < len(g.uuids) else ""
                    out.append(GpuSpec(node.name, i, g.model, g.mode, uuid))
                    i += 1
        return tuple(out)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    priority: str
    replicas: int
    need_mib: int
    """VRAM one replica needs (explicit ``vram_mib`` or the estimate's total)."""
    isolation: Isolation = Isolation.ANY
    role: Role = Role.LLM
    model: str = ""
    arch: ModelArch | None = None
    max_context: int = 4096
    concurrency: int = 1
    quant: str = "bf16"
    kv_dtype: str = "bf16"
    compute_pct: int | None = None
    explicit_vram: bool = False

    @property
    def priority_value(self) -> int:
        return PRIORITY_VALUES[self.priority]


@dataclass(frozen=True, slots=True)
class WorkloadSet:
    workloads: tuple[WorkloadSpec, ...]
    source: str = "workloads"

    def __iter__(self) -> Any:
        return iter(self.workloads)

    def by_name(self, name: str) -> WorkloadSpec:
        for w in self.workloads:
            if w.name == name:
                return w
        raise KeyError(name)


@dataclass
class _Ctx:
    source: str
    base_dir: Path | None = None
    seen: set[str] = field(default_factory=set)

    def err(self, key: str, value: object, reason: str) -> SpecError:
        return SpecError(self.source, key, value, reason)

    def mapping(self, value: object, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.err(key, value, "expected a mapping")
        for k in value:
            if k not in allowed:
                path = f"{key}.{k}" if key else str(k)
                raise self.err(path, value[k], f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def integer(self, value: object, key: str, lo: int, hi: int) -> int:
        if type(value) is not int or not lo <= value <= hi:
            raise self.err(key, value, f"expected an integer in [{lo}, {hi}]")
        return value

    def name(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            raise self.err(key, value, "expected a name of letters, digits, '.', '_' or '-' (max 63)")
        return value


def load_cluster_spec(data: object, *, source: str = "cluster") -> ClusterSpec:
    """Validate a cluster spec dict (see the module docstring for keys)."""
    ctx = _Ctx(source)
    top = ctx.mapping(data, "", {"nodes"})
    nodes_raw = top.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ctx.err("nodes", nodes_raw, "expected a non-empty list of nodes")
    nodes: list[NodeSpec] = []
    seen_uuids: set[str] = set()
    for i, raw in enumerate(nodes_raw):
        key = f"nodes[{i}]"
        n = ctx.mapping(raw, key, {"name", "gpus", "labels"})
        name = ctx.name(n.get("name"), f"{key}.name")
        if name in ctx.seen:
            raise ctx.err(f"{key}.name", name, "duplicate node name")
        ctx.seen.add(name)
        gpus_raw = n.get("gpus")
        if not isinstance(gpus_raw, list) or not gpus_raw:
            raise ctx.err(f"{key}.gpus", gpus_raw, "expected a non-empty list of {model, count}")
        groups = [_gpu_group(ctx, g, f"{key}.gpus[{j}]", seen_uuids) for j, g in enumerate(gpus_raw)]
        labels_raw = n.get("labels", {})
        if not isinstance(labels_raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels_raw.items()
        ):
            raise ctx.err(f"{key}.labels", labels_raw, "expected a mapping of strings to strings")
        nodes.append(NodeSpec(name, tuple(groups), tuple(sorted(labels_raw.items()))))
    return ClusterSpec(tuple(nodes), source)


def _gpu_group(ctx: _Ctx, raw: object, key: str, seen_uuids: set[str]) -> GpuGroupSpec:
    if isinstance(raw, str):
        raw = {"model": raw}
    g = ctx.mapping(raw, key, {"model", "count", "mode", "uuids"})
    try:
        model = gpu_model(g.get("model"))  # type: ignore[arg-type]
    except UnknownGpuModelError as exc:
        known = ", ".join(known_gpu_models())
        raise ctx.err(f"{key}.model", exc.name, f"unknown GPU model (known: {known})") from None
    count = ctx.integer(g.get("count", 1), f"{key}.count", 1, 64)
    mode: GpuMode | None = None
    if "mode" in g:
        try:
            mode = GpuMode(g["mode"])
        except ValueError:
            raise ctx.err(f"{key}.mode", g["mode"], f"expected one of {[m.value for m in GpuMode]}") from None
        if mode is GpuMode.MIG and not model.mig_capable:
            raise ctx.err(f"{key}.mode", "mig", f"{model.name} does not support MIG")
        if mode is GpuMode.MPS and not model.mps_capable:
            raise ctx.err(f"{key}.mode", "mps", f"{model.name} does not support MPS")
    uuids_raw = g.get("uuids", [])
    if not isinstance(uuids_raw, list) or len(uuids_raw) > count:
        raise ctx.err(f"{key}.uuids", uuids_raw, f"expected a list of at most {count} GPU UUIDs")
    for u in uuids_raw:
        if not isinstance(u, str) or not u.startswith("GPU-") or u in seen_uuids:
            raise ctx.err(f"{key}.uuids", u, "expected unique 'GPU-...' UUID strings")
        seen_uuids.add(u)
    return GpuGroupSpec(model, count, mode, tuple(uuids_raw))


_WORKLOAD_KEYS = {
    "name", "model", "vram_mib", "priority", "replicas", "max_context", "concurrency", "isolation",
    "quant", "kv_dtype", "kv_tokens", "compute_pct", "role",
}  # fmt: skip


def load_workload_spec(
    data: object, *, source: str = "workloads", base_dir: Path | None = None
) -> WorkloadSet:
    """Validate a workload spec dict; ``base_dir`` resolves relative config.json model paths."""
    ctx = _Ctx(source, base_dir)
    top = ctx.mapping(data, "", {"workloads"})
    raw_list = top.get("workloads")
    if not isinstance(raw_list, list) or not raw_list:
        raise ctx.err("workloads", raw_list, "expected a non-empty list of workloads")
    out = [_workload(ctx, raw, f"workloads[{i}]") for i, raw in enumerate(raw_list)]
    return WorkloadSet(tuple(out), source)


def _choice(ctx: _Ctx, w: dict[str, Any], key: str, *, path: str, default: str, allowed: list[str]) -> str:
    value = w.get(key, default)
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ctx.err(f"{path}.{key}", value, f"expected one of {allowed}")
    return value.lower()


def _workload(ctx: _Ctx, raw: object, key: str) -> WorkloadSpec:
    w = ctx.mapping(raw, key, _WORKLOAD_KEYS)
    name = ctx.name(w.get("name"), f"{key}.name")
    if name in ctx.seen:
        raise ctx.err(f"{key}.name", name, "duplicate workload name")
    ctx.seen.add(name)
    prio = w.get("priority", "P1")
    if not isinstance(prio, str) or prio.upper() not in PRIORITY_VALUES:
        raise ctx.err(f"{key}.priority", prio, "expected P0, P1 or P2")
    replicas = ctx.integer(w.get("replicas", 1), f"{key}.replicas", 1, MAX_REPLICAS)
    concurrency = ctx.integer(w.get("concurrency", 1), f"{key}.concurrency", 1, 1 << 16)
    isolation = Isolation(
        _choice(ctx, w, "isolation", path=key, default="any", allowed=[i.value for i in Isolation])
    )
    quant = _choice(ctx, w, "quant", path=key, default="bf16", allowed=list(QUANT_BYTES))
    kv_dtype = _choice(ctx, w, "kv_dtype", path=key, default="bf16", allowed=list(KV_DTYPE_BYTES))
    compute_pct = None
    if w.get("compute_pct") is not None:
        compute_pct = ctx.integer(w["compute_pct"], f"{key}.compute_pct", 1, 100)
    kv_tokens = None
    if w.get("kv_tokens") is not None:
        kv_tokens = ctx.integer(w["kv_tokens"], f"{key}.kv_tokens", 0, 1 << 30)
    model_name = w.get("model")
    vram = w.get("vram_mib")
    arch: ModelArch | None = None
    if model_name is None and vram is None:
        raise ctx.err(f"{key}.model", None, "give a catalogue model name or vram_mib")
    if model_name is not None:
        if not isinstance(model_name, str) or not model_name:
            raise ctx.err(f"{key}.model", model_name, "expected a model name or a config.json path")
        try:
            arch = resolve_model(model_name, base_dir=ctx.base_dir)
        except UnknownModelError:
            known = ", ".join(known_models())
            raise ctx.err(
                f"{key}.model", model_name, f"unknown model (known: {known}; or give vram_mib)"
            ) from None
        except BadModelConfigError as exc:
            raise ctx.err(f"{key}.model", model_name, str(exc)) from None
    default_ctx = min(arch.max_positions, 4096) if arch is not None else 4096
    max_context = ctx.integer(w.get("max_context", default_ctx), f"{key}.max_context", 1, 1 << 24)
    if arch is not None and max_context > arch.max_positions:
        raise ctx.err(f"{key}.max_context", max_context, f"{arch.name} supports at most {arch.max_positions}")
    if vram is not None:
        need = ctx.integer(vram, f"{key}.vram_mib", 1, 16 * 1024 * 1024)
    else:
        assert arch is not None
        need = estimate(
            arch,
            quant=quant,
            max_context=max_context,
            concurrency=concurrency,
            kv_dtype=kv_dtype,
            kv_tokens=kv_tokens,
        ).total_mib
    role = _role(ctx, w, key, arch=arch, need=need, prio=prio.upper())
    return WorkloadSpec(
        name=name,
        priority=prio.upper(),
        replicas=replicas,
        need_mib=need,
        isolation=isolation,
        role=role,
        model=model_name or "",
        arch=arch,
        max_context=max_context,
        concurrency=concurrency,
        quant=quant,
        kv_dtype=kv_dtype,
        compute_pct=compute_pct,
        explicit_vram=vram is not None,
    )


GUARDRAIL_MAX_MIB = 8 * 1024
"""A decoder replica needing at most this much is a guardrail/intent model unless ``role`` says otherwise."""


def _role(ctx: _Ctx, w: dict[str, Any], key: str, *, arch: ModelArch | None, need: int, prio: str) -> Role:
    if "role" in w:
        return Role(_choice(ctx, w, "role", path=key, default="llm", allowed=[r.value for r in Role]))
    if prio == "P2":
        return Role.BATCH
    if arch is not None and not arch.is_decoder:
        return Role.RERANK if arch.head == "classifier" else Role.EMBEDDING
    return Role.GUARDRAIL if need <= GUARDRAIL_MAX_MIB else Role.LLM
