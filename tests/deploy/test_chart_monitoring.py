"""The chart's monitoring templates (deploy/helm/gpupool/templates/monitoring/): the Grafana dashboard
ConfigMap carries deploy/grafana/gpupool.json with the sidecar label; with
``monitoring.prometheusOperator=true`` the PrometheusRule carries deploy/prometheus/gpupool-rules.yaml
and the ServiceMonitor/PodMonitor select the gateway Service and the agent pods on ports they really
have, naming the scrape jobs as the rules expect; off by default (the CRDs may be missing).

helm is not installed here: `render` understands exactly what these templates use (``if`` / ``end``
on their own lines, ``.Values.x [| quote]``, ``.Files.Get "f" | indent N``) and rejects anything else.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpupool"
RULES = ROOT / "deploy" / "prometheus" / "gpupool-rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpupool.json"

_IF = re.compile(r"^\{\{-?\s*if\s+\.Values\.([\w.]+)\s*-?\}\}$")
_END = re.compile(r"^\{\{-?\s*end\s*-?\}\}$")
_FILE = re.compile(r'^\{\{\s*\.Files\.Get\s+"([^"]+)"\s*\|\s*indent\s+(\d+)\s*\}\}$')
_EXPR = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_VALUE = re.compile(r"^\.Values\.([\w.]+)(\s*\|\s*quote)?$")


def _get(values: dict[str, Any], path: str) -> Any:
    cur: Any = values
    for k in path.split("."):
        cur = cur[k]
    return cur


def render(text: str, values: dict[str, Any]) -> str:
    out: list[str] = []
    stack: list[bool] = []
    for line in text.splitlines():
        s = line.strip()
        if m := _IF.match(s):
            stack.append(bool(_get(values, m.group(1))))
            continue
        if _END.match(s):
            stack.pop()
            continue
        if not all(stack):
            continue
        if m := _FILE.match(s):
            pad = " " * int(m.group(2))
            out.extend(pad + x if x else x for x in (CHART / m.group(1)).read_text().splitlines())
            continue

        def sub(m: re.Match[str]) -> str:
            v = _VALUE.match(m.group(1))
            if v is None:
                raise ValueError(f"unsupported template expression {m.group(0)!r}")
            value = _get(values, v.group(1))
            return json.dumps(str(value)) if v.group(2) else str(value)

        out.append(_EXPR.sub(sub, line))
    assert not stack, "unbalanced if/end"
    return "\n".join(out) + "\n"


def rendered(**monitoring: Any) -> list[dict[str, Any]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values = copy.deepcopy(values)
    values["monitoring"].update(monitoring)
    docs: list[dict[str, Any]] = []
    for p in sorted((CHART / "templates" / "monitoring").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(render(p.read_text(), values)) if d)
    return docs


def _plain(kind: str, name: str) -> dict[str, Any]:
    for p in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for d in yaml.safe_load_all(p.read_text()):
            if d and d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise KeyError((kind, name))


def _rule_jobs() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {m for g in doc["groups"] for r in g["rules"] for m in re.findall(r'job="([^"]+)"', r["expr"])}


def test_chart_files_are_the_deploy_files() -> None:
    assert (CHART / "files" / "gpupool-rules.yaml").read_bytes() == RULES.read_bytes()
    assert (CHART / "files" / "gpupool.json").read_bytes() == DASHBOARD.read_bytes()


def test_defaults_render_only_the_dashboard() -> None:
    docs = rendered()
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("ConfigMap", "gpupool-grafana-dashboard")]
    cm = docs[0]
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert cm["metadata"]["namespace"] == "gpupool-system"
    assert json.loads(cm["data"]["gpupool.json"]) == json.loads(DASHBOARD.read_text())
    assert rendered(grafanaDashboard=False) == []


def test_prometheus_operator_objects() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered(prometheusOperator=True)}
    assert set(docs) == {
        ("ConfigMap", "gpupool-grafana-dashboard"),
        ("PrometheusRule", "gpupool"),
        ("ServiceMonitor", "gpupool-gateway"),
        ("PodMonitor", "gpupool-agent"),
    }
    for (kind, _), d in docs.items():
        if kind != "ConfigMap":
            assert d["apiVersion"] == "monitoring.coreos.com/v1"
            assert d["metadata"]["labels"] == {"release": "kube-prometheus-stack"}
    assert docs[("PrometheusRule", "gpupool")]["spec"] == yaml.safe_load(RULES.read_text())

    svc = _plain("Service", "gpupool-gateway")
    sm = docs[("ServiceMonitor", "gpupool-gateway")]["spec"]
    assert sm["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}

    ds = _plain("DaemonSet", "gpupool-node")
    pod = ds["spec"]["template"]
    pm = docs[("PodMonitor", "gpupool-agent")]["spec"]
    assert pm["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    agent = next(c for c in pod["spec"]["containers"] if c["name"] == "agent")
    assert {e["port"] for e in pm["podMetricsEndpoints"]} <= {p["name"] for p in agent["ports"]}
    assert "0.0.0.0" in agent["args"][agent["args"].index("--metrics-host") + 1]

    jobs = {
        r["replacement"]
        for e in [*sm["endpoints"], *pm["podMetricsEndpoints"]]
        for r in e["relabelings"]
        if r["targetLabel"] == "job"
    }
    assert jobs == _rule_jobs() == {"gpupool-gateway", "gpupool-agent"}


def test_renderer_rejects_what_it_does_not_understand() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        render('x: {{ include "foo" . }}\n', {})
