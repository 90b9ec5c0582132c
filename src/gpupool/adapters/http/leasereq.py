"""A lease request body (`LeaseIn`) as the core `Request` it asks for, for one caller.

Role: the checks that need the gateway (its KV-cache sizer, its pool's nodes) or the caller's role,
beyond the body's schema: VRAM from ``model`` + tokens when ``vram_mib`` is absent, one of
``compute_pct`` / ``compute_milli``, ``nodes`` naming at least one node of the pool, and
``gpupool.io/`` labels only from role ``admin`` (`AGENT_LABEL_PREFIX`). Every refusal names the field
(`InvalidInput`: 422; the label: 403) and happens before anything changes.
"""

from __future__ import annotations

from gpupool.adapters.http import schemas as s
from gpupool.adapters.http.auth import Principal
from gpupool.adapters.http.context import Gateway
from gpupool.adapters.http.errors import HttpError as _HttpError
from gpupool.core.errors import InvalidInput
from gpupool.core.ids import random_lease_id
from gpupool.core.model import Request as CoreRequest
from gpupool.core.priority import parse_priority
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.units import Resources

AGENT_LABEL_PREFIX = "gpupool.io/"
"""Labels that direct the node agents when a lease ends or its GPU runs hot (``gpupool.io/pgid``,
``pids``, ``cgroup``: whom to stop or kill; ``endpoint``: what to call; ``pod``: what to evict; see
`gpupool.agent.workloads`). The agent runs as root and trusts them, so only role ``admin`` (the
platform's job launcher) may set them: a tenant could otherwise name any process on a node."""


def build_request(gw: Gateway, body: s.LeaseIn, who: Principal) -> CoreRequest:
    if not who.is_admin:
        reserved = sorted(k for k in body.labels if k.startswith(AGENT_LABEL_PREFIX))
        if reserved:
            raise _HttpError(
                403,
                f"label {reserved[0]!r} needs role admin: {AGENT_LABEL_PREFIX} labels tell node agents which"
                " processes to signal, which endpoint to call and which pod to evict",
                "forbidden",
                field=f"labels.{reserved[0]}",
            )
    prio = parse_priority(body.priority)
    vram = body.vram_mib
    model = body.model or ""
    if vram is None:
        if not model:
            raise InvalidInput("vram_mib", None, "give vram_mib, or model with prompt_tokens/max_tokens")
        if gw.sizer is None:
            raise InvalidInput("model", model, "this gateway has no KV-cache estimator")
        tokens = (body.prompt_tokens or 0) + (body.max_tokens or gw.default_max_tokens)
        try:
            if model in gw.controller.models():
                vram = gw.sizer.request_mib(model, tokens)
            else:
                vram = gw.sizer.instance_mib(model, tokens)
        except ValueError as exc:
            raise InvalidInput("model", model, str(exc)) from None
    if body.compute_milli is not None and body.compute_pct is not None:
        raise InvalidInput("compute_pct", body.compute_pct, "give compute_pct or compute_milli, not both")
    compute = body.compute_milli if body.compute_milli is not None else (body.compute_pct or 0) * 10
    if body.nodes and set(gw.controller.allocator.ledger.nodes()).isdisjoint(body.nodes):
        # like an unknown gpu_id: a typo is bad input, not a pool that could never serve it (503)
        raise InvalidInput("nodes", sorted(set(body.nodes)), "no such node in the pool")
    return CoreRequest(
        id=random_lease_id(),  # a UUID4's text, from the batched OS random source
        tenant=who.tenant,
        priority=prio,
        demand=Resources(vram, compute),
        ttl_s=float(body.ttl_s),
        kinds=frozenset(SliceKind(k) for k in body.kinds),
        preemptible=body.preemptible,
        gpu_count=body.gpu_count,
        nodes=frozenset(body.nodes),
        model=model,
        labels=tuple(sorted(body.labels.items())),
    )


__all__ = ["AGENT_LABEL_PREFIX", "build_request"]
