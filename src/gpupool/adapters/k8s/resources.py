"""Extended resource names and the pod -> `PodDemand` parser (standard library only).

Resources (the domain is configurable, default ``gpupool.io``):
- ``<domain>/vram-mib``: VRAM per card in MiB (integer);
- ``<domain>/compute-pct``: compute per card in percent of one GPU, 0-100 (integer; 0 = no share);
- ``<domain>/gpu``: number of cards (default 1). The device plugin advertises it, so kubelet sees it;
  vram-mib and compute-pct are extender-only (``ignoredByScheduler: true``): kubelet drops them.

Parsing rules (each violation is an `InvalidInput` naming the field and value):
- values are read from ``limits`` first, then ``requests`` (extended resources need requests == limits);
  each is a JSON integer or a Kubernetes quantity string with a whole-number value (``8000``, and its
  canonical form ``8k`` that the API server re-emits, ``1Ki``, ``1e3``); fractions are refused;
- exactly one container (not an init container) may ask for gpupool resources: kubelet's Allocate
  carries no pod identity and multi-container matching is where HAMi and gpushare broke;
- a container that asks only for ``<domain>/gpu`` gets whole cards: compute 100 %, and 1 MiB of VRAM
  as the per-card minimum (with ``gpu > 1`` the core grants N entire WHOLE cards anyway);
- priority: ``spec.priority`` (set by the PriorityClass admission) clamped to the core's range, else
  the value of a known gpupool PriorityClass name, else 0;
- the slice kind may be pinned with the annotation ``<domain>/slice-kind`` (``mig``, ``mps``, ``whole``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.core.model import MAX_GPU_COUNT, MAX_VRAM_MIB, Request
from gpupool.core.priority import P0, P1, P2, PRIORITY_MAX, PRIORITY_MIN
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources

DEFAULT_DOMAIN = "gpupool.io"

PRIORITY_CLASSES: dict[str, int] = {"gpupool-p0": P0, "gpupool-p1": P1, "gpupool-p2": P2}
"""PriorityClass name -> value; deploy/ ships these (P2 is preemptible, P0/P1 are not)."""

DEFAULT_TTL_S = 24 * 3600.0
"""Placement lease TTL; the reconciler renews the leases of live pods on every resync."""


@dataclass(frozen=True, slots=True)
class ResourceNames:
    domain: str = DEFAULT_DOMAIN

    @property
    def vram(self) -> str:
        return f"{self.domain}/vram-mib"

    @property
    def compute(self) -> str:
        return f"{self.domain}/compute-pct"

    @property
    def gpu(self) -> str:
        return f"{self.domain}/gpu"

    @property
    def placement(self) -> str:
        """Pod annotation: the versioned placement record written at bind."""
        return f"{self.domain}/placement"

    @property
    def slices(self) -> str:
        """Node annotation: the node's slices, written by the node agent."""
        return f"{self.domain}/slices"

    @property
    def slice_kind(self) -> str:
        """Pod annotation: pin the slice kind (mig | mps | whole)."""
        return f"{self.domain}/slice-kind"

    def all(self) -> tuple[str, str, str]:
        return (self.vram, self.compute, self.gpu)


DEFAULT_NAMES = ResourceNames()


@dataclass(frozen=True, slots=True)
class PodDemand:
    """What one pod asks of the pool, per card, plus its identity."""

    uid: str
    namespace: str
    name: str
    priority: int
    vram_mib: int
    compute_milli: int
    gpu_count: int = 1
    kinds: frozenset[SliceKind] = frozenset()
    container: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def resources(self) -> Resources:
        return Resources(self.vram_mib, self.compute_milli)

    def to_request(self, *, nodes: frozenset[str] = frozenset(), ttl_s: float = DEFAULT_TTL_S) -> Request:
        return Request(
            id=self.uid,
            tenant=self.namespace or "default",
            priority=self.priority,
            demand=self.resources,
            ttl_s=ttl_s,
            kinds=self.kinds,
            gpu_count=self.gpu_count,
            nodes=nodes,
            labels=(("pod", self.key),),
        )


_QUANTITY = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?"
)
_SUFFIX_SCALE = {"m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SHIFT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


def quantity_value(text: str, field: str) -> Decimal:
    """The exact value of a Kubernetes quantity string (``8000``, ``8k``, ``1Ki``, ``1e3``,
    ``2000m``), as the API server emits them; `InvalidInput` when ``text`` is not one."""
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise InvalidInput(field, text, "must be a Kubernetes quantity (e.g. 8000, 8k, 1Ki, 1e3)")
    sign, number, exponent, suffix = m.groups()
    scale = int(exponent) if exponent is not None else _SUFFIX_SCALE.get(suffix or "", 0)
    exact = Context(prec=len(text) + 40, Emax=MAX_EMAX, Emin=MIN_EMIN)
    value = exact.scaleb(Decimal(sign + number), scale)
    return exact.multiply(value, Decimal(2 ** _BINARY_SHIFT.get(suffix or "", 0)))


def _int_quantity(value: object, field: str, *, lo: int, hi: int) -> int:
    """A whole-number quantity in ``[lo, hi]``: a JSON integer or a Kubernetes quantity string
    (the API server re-emits ``8000`` as ``8k``: that is what kube-scheduler sends)."""
    if isinstance(value, bool):
        raise InvalidInput(field, value, "must be an integer")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        exact = quantity_value(value, field)
        if not lo - 1 < exact < hi + 1:  # (before int(): "1e999999999" has a billion digits)
            raise InvalidInput(field, value, f"must be in [{lo}, {hi}]")
        if exact != exact.to_integral_value():
            raise InvalidInput(field, value, "must be a whole number")
        n = int(exact)
    else:
        raise InvalidInput(field, value, "must be an integer or a Kubernetes quantity string")
    if not lo <= n <= hi:
        raise InvalidInput(field, n, f"must be in [{lo}, {hi}]")
    return n


def _obj(value: object, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(field, type(value).__name__, "must be a JSON object")
    return value


def _container_asks(c: dict[str, Any], names: ResourceNames, field: str) -> dict[str, object]:
    res = _obj(c.get("resources"), f"{field}.resources")
    limits = _obj(res.get("limits"), f"{field}.resources.limits")
    requests = _obj(res.get("requests"), f"{field}.resources.requests")
    out: dict[str, object] = {}
    for key in names.all():
        if key in limits:
            out[key] = limits[key]
        elif key in requests:
            out[key] = requests[key]
    return out


def pod_priority(spec: dict[str, Any]) -> int:
    value = spec.get("priority")
    if isinstance(value, int) and not isinstance(value, bool):
        return max(PRIORITY_MIN, min(PRIORITY_MAX, value))
    name = spec.get("priorityClassName")
    if isinstance(name, str) and name in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[name]
    return 0


def parse_pod(pod: object, names: ResourceNames = DEFAULT_NAMES) -> PodDemand | None:
    """The pod's demand, or None when it asks for no gpupool resource. Raises `InvalidInput`."""
    pod = _obj(pod, "Pod")
    meta = _obj(pod.get("metadata"), "Pod.metadata")
    spec = _obj(pod.get("spec"), "Pod.spec")
    init_containers = spec.get("initContainers") or []
    if not isinstance(init_containers, list):
        raise InvalidInput("Pod.spec.initContainers", type(init_containers).__name__, "must be a list")
    for i, c in enumerate(init_containers):
        if _container_asks(_obj(c, f"Pod.spec.initContainers[{i}]"), names, "initContainers"):
            raise InvalidInput(
                f"Pod.spec.initContainers[{i}].resources",
                c.get("name"),
                "init containers cannot ask for gpupool GPUs",
            )
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise InvalidInput("Pod.spec.containers", type(containers).__name__, "must be a list")
    asking: list[tuple[str, dict[str, object]]] = []
    for i, c in enumerate(containers):
        field = f"Pod.spec.containers[{i}]"
        asks = _container_asks(_obj(c, field), names, field)
        if asks:
            asking.append((str(c.get("name", "")), asks))
    if not asking:
        return None
    if len(asking) > 1:
        raise InvalidInput(
            "Pod.spec.containers",
            [n for n, _ in asking],
            "only one container per pod may ask for gpupool GPUs",
        )
    container, asks = asking[0]
    field = f"Pod.spec.containers[{container}].resources"
    count = 1
    if names.gpu in asks:
        count = _int_quantity(asks[names.gpu], f"{field}[{names.gpu}]", lo=1, hi=MAX_GPU_COUNT)
    if names.vram in asks:
        vram = _int_quantity(asks[names.vram], f"{field}[{names.vram}]", lo=1, hi=MAX_VRAM_MIB)
        pct = 0
        if names.compute in asks:
            pct = _int_quantity(asks[names.compute], f"{field}[{names.compute}]", lo=0, hi=100)
    elif names.compute in asks:
        raise InvalidInput(f"{field}[{names.vram}]", None, f"{names.compute} needs {names.vram} too")
    else:
        vram, pct = 1, 100
    kinds: frozenset[SliceKind] = frozenset()
    annotations = _obj(meta.get("annotations"), "Pod.metadata.annotations")
    raw_kind = annotations.get(names.slice_kind)
    if raw_kind is not None:
        try:
            kinds = frozenset({SliceKind(str(raw_kind).strip().lower())})
        except ValueError:
            raise InvalidInput(
                f"Pod.metadata.annotations[{names.slice_kind}]", raw_kind, "must be mig, mps or whole"
            ) from None
        if count > 1 and SliceKind.WHOLE not in kinds:
            raise InvalidInput(
                f"Pod.metadata.annotations[{names.slice_kind}]", raw_kind, "a multi-GPU pod needs whole cards"
            )
    uid = meta.get("uid") or ""
    ns = meta.get("namespace") or "default"
    name = meta.get("name") or ""
    if not isinstance(uid, str) or not isinstance(ns, str) or not isinstance(name, str):
        raise InvalidInput("Pod.metadata", (uid, ns, name), "uid, namespace and name must be strings")
    if not name:
        raise InvalidInput("Pod.metadata.name", name, "must be a non-empty string")
    return PodDemand(
        uid=uid or f"{ns}/{name}",
        namespace=ns,
        name=name,
        priority=pod_priority(spec),
        vram_mib=vram,
        compute_milli=pct * COMPUTE_MILLI_PER_GPU // 100,
        gpu_count=count,
        kinds=kinds,
        container=container,
    )
