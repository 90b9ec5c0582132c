"""The embedded default: the seed's four-tier agent platform on 4 x A100-80GB + 2 x L40S, simulated.

``embedded_default(seed=0)`` is what ``make run`` / ``gpupool serve`` use when no GPU and no spec file
is given. The two dicts are the same documents as ``examples/cluster-a100-l40s.yaml`` and
``examples/workloads-agent-platform.yaml`` (a test keeps them in sync).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.adapters.simulated.cluster import SimulatedCluster
from gpupool.hardware.planner import plan
from gpupool.hardware.spec import load_cluster_spec, load_workload_spec

DEFAULT_CLUSTER: dict[str, Any] = {
    "nodes": [
        {"name": "gpu-a", "gpus": [{"model": "A100-SXM4-80GB", "count": 4}]},
        {"name": "gpu-b", "gpus": [{"model": "L40S-48GB", "count": 2}]},
    ]
}

DEFAULT_WORKLOADS: dict[str, Any] = {
    "workloads": [
        {"name": "main-llm", "model": "qwen2.5-32b", "quant": "awq", "priority": "P0", "replicas": 3,
         "max_context": 16384, "concurrency": 4, "isolation": "mig"},
        {"name": "guardrail", "model": "qwen2.5-0.5b", "priority": "P0", "replicas": 2, "max_context": 4096,
         "concurrency": 16, "isolation": "any"},
        {"name": "intent", "model": "qwen2.5-1.5b", "priority": "P0", "replicas": 2, "max_context": 4096,
         "concurrency": 8},
        {"name": "embedding", "model": "bge-m3", "priority": "P1", "replicas": 2, "max_context": 512,
         "concurrency": 32},
        {"name": "rerank", "model": "bge-reranker-v2-m3", "priority": "P1", "replicas": 2,
         "max_context": 1024,
         "concurrency": 16},
        {"name": "batch-eval", "model": "qwen2.5-7b", "priority": "P2", "replicas": 1, "max_context": 8192,
         "concurrency": 8},
    ]
}  # fmt: skip


def embedded_default(*, seed: int = 0, vram_registry: Path | None = None) -> SimulatedCluster:
    """The seed's platform, planned and simulated (deterministic for a given seed); ``vram_registry``:
    real processes may hold memory on it (`gpupool.adapters.simulated.vram`)."""
    cluster = load_cluster_spec(DEFAULT_CLUSTER, source="embedded-default-cluster")
    workloads = load_workload_spec(DEFAULT_WORKLOADS, source="embedded-default-workloads")
    return SimulatedCluster(cluster, plan(cluster, workloads), seed=seed, vram_registry=vram_registry)
