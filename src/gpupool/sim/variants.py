"""Workload variants of a pod list, built the way the FGD authors built theirs from the Alibaba trace.

Role: from one base pod list (the production ``default`` list) and a seed, derive a variant with up
to four knobs changed; every other property of the base is kept. A variant is named by its knobs
(`parse_variant`): ``base``, or tokens joined by ``-`` such as ``cpu300``, ``share60``,
``multi40``, ``spec33`` (``cpu300-multi40`` turns two knobs). Knobs, all integer percentages:

- ``cpu<P>``: the CPU request of every GPU pod scaled to P % (0..300) of the base, rounded down and
  capped at the largest CPU of a node with enough GPUs for the pod (so no pod becomes unplaceable);
  CPU-only pods are left alone.
- ``share<P>``: GPU-sharing pods (1 GPU, < 1000 milli) carry P % (1..100) of the GPU request, with
  the task count kept (like the authors' ``gpushare40/60``): while below, a non-sharing GPU pod
  (whole 1-GPU pods first, then multi-GPU ones, each group in random order) takes the CPU, memory
  and GPU share of a random sharing pod of the base; while above, a sharing pod takes the resources
  of a random whole 1-GPU pod.
- ``multi<P>``: multi-GPU pods carry at least P % (1..90) of the GPU request: copies of random
  multi-GPU pods of the list so far (the base, after ``share<P>`` when both are given) are appended
  under new names (like the authors' ``multigpu20/30``,
  whose task count grows). A base already at or above P % is left alone.
- ``spec<P>``: at least P % (0..100) of GPU pods are pinned to one GPU model (like
  ``gpuspec10/20``; the production share is about 33 %): random unpinned pods get a model drawn
  with probability proportional to the GPUs of the nodes that could host the pod (enough GPUs and
  CPU). Pins of the base are kept, so a base already at or above P % is left alone.

Order of application: share, multi, cpu, spec (spec last so it sees the final CPU requests).
Reproducibility: each knob draws from its own generator, ``default_rng([seed, knob])``, so a variant
is a pure function of (base pods, nodes, name, seed) and turning one knob never reshuffles another.
Invariants: names stay unique; every pod obeys the trace invariants (`gpupool.sim.trace`), so a
written variant loads with `load_pods`.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.sim.trace import MILLI_PER_GPU, NodeSpec, PodSpec

KNOBS = ("share", "multi", "cpu", "spec")
KNOB_RANGE_PCT = {"cpu": (0, 300), "share": (1, 100), "multi": (1, 90), "spec": (0, 100)}
NEW_POD_PREFIX = "variant-pod-"

DEFAULT_MATRIX = (
    "base",
    "cpu0",
    "cpu200",
    "cpu300",
    "share20",
    "multi40",
    "multi50",
    "spec33",
    "cpu200-multi40",
)
"""The default matrix (9): the base, each knob at one to three settings beyond the nine published
workloads (share 40/60, multi 20/30 and spec 10/20 are those), and one combination."""


@dataclass(frozen=True, slots=True)
class VariantSpec:
    name: str
    cpu_pct: int | None = None
    share_pct: int | None = None
    multi_pct: int | None = None
    spec_pct: int | None = None


_TOKEN = re.compile(r"^(cpu|share|multi|spec)([0-9]{1,9})$")  # ASCII digits: a name is a file name


def parse_variant(name: str) -> VariantSpec:
    """``base`` or ``-``-joined knob tokens; `InvalidInput` naming the token otherwise."""
    text = name.strip()
    if text == "base":
        return VariantSpec(name="base")
    values: dict[str, int] = {}
    for token in text.split("-") if text else [""]:
        m = _TOKEN.match(token)
        if m is None:
            raise InvalidInput(
                "variant", name, f"token {token!r} is not base, cpu<P>, share<P>, multi<P> or spec<P>"
            )
        knob, pct = m.group(1), int(m.group(2))
        lo, hi = KNOB_RANGE_PCT[knob]
        if not lo <= pct <= hi:
            raise InvalidInput("variant", name, f"{knob} must be in [{lo}, {hi}] %, got {pct}")
        if knob in values:
            raise InvalidInput("variant", name, f"knob {knob} given twice")
        values[knob] = pct
    return VariantSpec(
        name=text,
        cpu_pct=values.get("cpu"),
        share_pct=values.get("share"),
        multi_pct=values.get("multi"),
        spec_pct=values.get("spec"),
    )


def _rng(seed: int, knob: str) -> np.random.Generator:
    return np.random.default_rng([seed, KNOBS.index(knob)])


def _demand(pods: Sequence[PodSpec]) -> tuple[int, int, int]:
    """(total, sharing, multi-GPU) GPU request in milli."""
    total = sum(p.total_gpu_milli for p in pods)
    sharing = sum(p.total_gpu_milli for p in pods if p.is_sharing)
    multi = sum(p.total_gpu_milli for p in pods if p.num_gpu > 1)
    return total, sharing, multi


def _take(p: PodSpec, t: PodSpec) -> PodSpec:
    return replace(
        p, cpu_milli=t.cpu_milli, memory_mib=t.memory_mib, num_gpu=t.num_gpu, gpu_milli=t.gpu_milli
    )


def with_share(pods: Sequence[PodSpec], pct: int, seed: int) -> list[PodSpec]:
    rng = _rng(seed, "share")
    out = list(pods)
    total, sharing, _ = _demand(out)
    sharers = [p for p in pods if p.is_sharing]
    wholes = [p for p in pods if p.num_gpu == 1 and p.gpu_milli == MILLI_PER_GPU]
    if sharing * 100 < pct * total:
        if not sharers:
            raise InvalidInput("variant", f"share{pct}", "the base has no GPU-sharing pod to copy")
        single = [i for i, p in enumerate(out) if p.num_gpu == 1 and not p.is_sharing]
        multi = [i for i, p in enumerate(out) if p.num_gpu > 1]
        for i in [*rng.permutation(single).tolist(), *rng.permutation(multi).tolist()]:
            if sharing * 100 >= pct * total:
                break
            t = sharers[int(rng.integers(len(sharers)))]
            total += t.gpu_milli - out[i].total_gpu_milli
            sharing += t.gpu_milli
            out[i] = _take(out[i], t)
    elif sharing * 100 > pct * total:
        if not wholes:
            raise InvalidInput("variant", f"share{pct}", "the base has no whole 1-GPU pod to copy")
        for i in rng.permutation([i for i, p in enumerate(out) if p.is_sharing]).tolist():
            if sharing * 100 <= pct * total:
                break
            t = wholes[int(rng.integers(len(wholes)))]
            total += t.gpu_milli - out[i].gpu_milli
            sharing -= out[i].gpu_milli
            out[i] = _take(out[i], t)
    return out


def with_multi(pods: Sequence[PodSpec], pct: int, seed: int) -> list[PodSpec]:
    rng = _rng(seed, "multi")
    out = list(pods)
    total, _, multi = _demand(out)
    multis = [p for p in pods if p.num_gpu > 1]
    if not multis:
        raise InvalidInput("variant", f"multi{pct}", "the base has no multi-GPU pod to copy")
    n = 0
    while multi * 100 < pct * total:
        t = multis[int(rng.integers(len(multis)))]
        n += 1
        out.append(replace(t, name=f"{NEW_POD_PREFIX}{n:06d}"))
        total += t.total_gpu_milli
        multi += t.total_gpu_milli
    return out


def _cpu_cap(nodes: Sequence[NodeSpec], num_gpu: int) -> int:
    return max((nd.cpu_milli for nd in nodes if nd.gpu_count >= num_gpu), default=0)


def with_cpu(pods: Sequence[PodSpec], pct: int, nodes: Sequence[NodeSpec]) -> list[PodSpec]:
    caps = {k: _cpu_cap(nodes, k) for k in {p.num_gpu for p in pods if p.num_gpu}}
    return [
        replace(p, cpu_milli=min(p.cpu_milli * pct // 100, max(caps[p.num_gpu], p.cpu_milli)))
        if p.num_gpu
        else p
        for p in pods
    ]


def with_spec(pods: Sequence[PodSpec], pct: int, seed: int, nodes: Sequence[NodeSpec]) -> list[PodSpec]:
    rng = _rng(seed, "spec")
    out = list(pods)
    gpu_pods = [i for i, p in enumerate(out) if p.num_gpu]
    want = len(gpu_pods) * pct // 100
    have = sum(1 for i in gpu_pods if out[i].gpu_spec)
    models = sorted({nd.gpu_model for nd in nodes if nd.gpu_count})
    gpu_count = np.array([nd.gpu_count for nd in nodes], dtype=np.int64)
    cpu = np.array([nd.cpu_milli for nd in nodes], dtype=np.int64)
    model_of = np.array([models.index(nd.gpu_model) if nd.gpu_count else -1 for nd in nodes])
    for i in rng.permutation([i for i in gpu_pods if not out[i].gpu_spec]).tolist():
        if have >= want:
            break
        p = out[i]
        host = (gpu_count >= p.num_gpu) & (cpu >= p.cpu_milli) & (model_of >= 0)
        weight = np.bincount(model_of[host], weights=gpu_count[host], minlength=len(models))
        if weight.sum() <= 0:
            continue
        m = models[int(rng.choice(len(models), p=weight / weight.sum()))]
        out[i] = replace(p, gpu_spec=frozenset({m}))
        have += 1
    return out


def make_variant(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], name: str, *, seed: int
) -> tuple[PodSpec, ...]:
    """The variant ``name`` of ``pods`` for ``seed`` (see the module docstring). `InvalidInput`
    naming the whole variant when the pods lack what a knob copies."""
    spec = parse_variant(name)
    out = list(pods)
    try:
        if spec.share_pct is not None:
            out = with_share(out, spec.share_pct, seed)
        if spec.multi_pct is not None:
            multi = any(p.num_gpu > 1 for p in pods)
            if multi and not any(p.num_gpu > 1 for p in out):  # the base had some: share took them
                raise InvalidInput(
                    "variant",
                    name,
                    f"share{spec.share_pct} turns every multi-GPU pod into a sharing one, so multi"
                    f"{spec.multi_pct} has none left to copy",
                )
            out = with_multi(out, spec.multi_pct, seed)
    except InvalidInput as exc:  # a knob's error names the knob: name the whole variant
        raise InvalidInput("variant", spec.name, exc.reason) from None
    if spec.cpu_pct is not None:
        out = with_cpu(out, spec.cpu_pct, nodes)
    if spec.spec_pct is not None:
        out = with_spec(out, spec.spec_pct, seed, nodes)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class VariantStats:
    pods: int
    gpu_pods: int
    gpu_request_milli: int
    sharing_pct: float
    """Share of the GPU request carried by GPU-sharing pods, %."""
    multi_pct: float
    """Share of the GPU request carried by multi-GPU pods, %."""
    pinned_pct: float
    """Share of GPU pods with a GPU-model constraint, %."""
    cpu_per_gpu_milli: int
    """CPU request of GPU pods per GPU requested (milli-cores per whole GPU)."""


def stats(pods: Sequence[PodSpec]) -> VariantStats:
    total, sharing, multi = _demand(pods)
    gpu = [p for p in pods if p.num_gpu]
    cpu = sum(p.cpu_milli for p in gpu)
    return VariantStats(
        pods=len(pods),
        gpu_pods=len(gpu),
        gpu_request_milli=total,
        sharing_pct=round(100.0 * sharing / max(total, 1), 2),
        multi_pct=round(100.0 * multi / max(total, 1), 2),
        pinned_pct=round(100.0 * sum(1 for p in gpu if p.gpu_spec) / max(len(gpu), 1), 2),
        cpu_per_gpu_milli=cpu * MILLI_PER_GPU // max(total, 1),
    )


POD_HEADER = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


def write_pods(pods: Sequence[PodSpec], path: Path) -> None:
    """Write a pod list that `load_pods` reads back unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # concurrent writers never share one
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(POD_HEADER)
        for p in pods:
            w.writerow(
                [p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, "|".join(sorted(p.gpu_spec))]
            )
    tmp.replace(path)
