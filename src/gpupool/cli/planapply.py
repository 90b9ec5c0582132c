"""`gpupool plan --apply`: change the nodes' MIG layouts to the plan, through one `MigActuator`.

Role: the CLI side of MIG actuation. Dry run by default: prints, per node, what would be destroyed
(``-profile@start``) and created (``+profile@start``) on each GPU the plan puts in MIG mode, and
changes nothing; ``--apply`` acts and prints each node's outcome. Actuators:
- ``nvml``: this machine's GPUs through NVML (``--node`` names the node of the plan it is);
- ``mig-manager``: the GPU Operator's mig-manager through the Kubernetes API (ConfigMap + node
  label; ``--kube-api`` or the in-cluster / kubeconfig credentials);
- ``simulated``: a `SimulatedCluster` of the cluster spec whose MIG-planned GPUs are in MIG mode
  with no instances yet (a demo of the path; nothing outside the process changes).

Invariants: MIG mode is never toggled; a GPU whose MIG mode is off is reported, not changed; the
exit code is 0 when every node is as planned (or the dry run succeeded), 1 when an apply failed, 2
(one line, nothing changed) when the actuator cannot be used here (no NVML, no Kubernetes API).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

import typer

from gpupool.cli.errors import UserError
from gpupool.hardware.capability import GpuMode
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migactuate import ApplyOutcome, MigActuator, NvmlMigActuator, render_change
from gpupool.hardware.plantypes import Plan
from gpupool.hardware.spec import ClusterSpec


class ActuatorKind(StrEnum):
    SIMULATED = "simulated"
    NVML = "nvml"
    MIG_MANAGER = "mig-manager"


def wanted_by_node(p: Plan, nodes: Sequence[str] = ()) -> dict[str, dict[int, tuple[MigInstance, ...]]]:
    out: dict[str, dict[int, tuple[MigInstance, ...]]] = {}
    for g in p.gpus:
        if g.mode is GpuMode.MIG and (not nodes or g.node in nodes):
            out.setdefault(g.node, {})[g.index] = tuple(sorted(g.mig))
    return out


def _actuators(
    kind: ActuatorKind,
    cluster: ClusterSpec,
    wanted: Mapping[str, Mapping[int, Sequence[MigInstance]]],
    *,
    kube_api: str,
    namespace: str,
    config_map: str,
) -> dict[str, MigActuator]:
    if kind is ActuatorKind.SIMULATED:
        from gpupool.adapters.simulated import SimulatedCluster

        sim = SimulatedCluster(cluster)
        for node, gpus in wanted.items():
            for index in gpus:
                sim.set_mig_mode(f"{node}/{index}", True)
        out: dict[str, MigActuator] = {}
        for node in wanted:
            sim_act = NvmlMigActuator(sim.mig_hardware(node))
            sim_act.name = "simulated NVML"
            out[node] = sim_act
        return out
    if kind is ActuatorKind.NVML:
        from gpupool.adapters.nvml.mig import NvmlMigHardware

        try:  # no driver or no nvidia-ml-py on this machine: one line, not a traceback
            hw = NvmlMigHardware()
        except Exception as exc:
            raise UserError(f"invalid --actuator={kind.value}: not usable here: {exc}") from None
        return {node: NvmlMigActuator(hw) for node in wanted}
    from gpupool.adapters.k8s.kubeapi import KubeApi, KubeConfigError
    from gpupool.adapters.k8s.migmanager import MigManagerActuator

    try:
        api = KubeApi.for_host(kube_api) if kube_api else KubeApi.from_environment()
    except KubeConfigError as exc:
        raise UserError(
            f"invalid --actuator={kind.value}: no Kubernetes API ({exc}): "
            "give --kube-api URL or run in-cluster"
        ) from None
    mm = MigManagerActuator(api, namespace=namespace, config_map=config_map)
    return dict.fromkeys(wanted, mm)


def run_apply(
    p: Plan,
    cluster: ClusterSpec,
    *,
    kind: ActuatorKind,
    nodes: Sequence[str],
    apply: bool,
    kube_api: str = "",
    namespace: str = "gpu-operator",
    config_map: str = "custom-mig-config",
) -> int:
    known = {n.name for n in cluster.nodes}
    for n in nodes:
        if n not in known:
            raise ValueError(
                f"--node: {n!r} is not a node of the cluster spec (nodes: {', '.join(sorted(known))})"
            )
    if kind is ActuatorKind.NVML and len(nodes) != 1:
        raise ValueError("--node: the nvml actuator acts on this machine: name exactly one node of the plan")
    wanted = wanted_by_node(p, nodes)
    if not wanted:
        typer.echo("no GPU of the plan is in MIG mode on these nodes: nothing to apply")
        return 0
    actuators = _actuators(
        kind, cluster, wanted, kube_api=kube_api, namespace=namespace, config_map=config_map
    )
    failed = False
    for node, gpus in sorted(wanted.items()):
        act = actuators[node]
        if isinstance(act, NvmlMigActuator):
            off = [i for i in sorted(gpus) if not act.hw.mig_enabled(i)]
            if off:
                typer.echo(
                    f"node {node}: MIG mode is off on GPU {', '.join(map(str, off))} (enable it first)"
                )
                failed = True
                continue
            for c in act.plan_changes(gpus):
                typer.echo(f"node {node}: {render_change(c)}")
        else:
            for i, insts in sorted(gpus.items()):
                typer.echo(f"node {node}: gpu {i}: -> {', '.join(map(str, insts))} (mig-manager places them)")
        if apply:
            out: ApplyOutcome = act.apply(node, gpus)
            typer.echo(f"node {node}: {'applied' if out.ok else 'FAILED'} via {out.actuator}: {out.detail}")
            failed = failed or not out.ok
    if not apply:
        typer.echo("dry run: nothing changed (add --apply to act)")
    return 1 if failed else 0
