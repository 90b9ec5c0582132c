"""deploy/prometheus and deploy/grafana against the real code and the real ``promtool``:

- ``promtool check rules`` and ``promtool test rules`` pass, and every alert has a unit test that
  expects it to fire (and one that expects it not to);
- ``promtool check metrics`` accepts the gateway's and a node agent's real ``/metrics`` pages (the
  agent's dcgm-exporter label names ``UUID``/``modelName``/``GPU_I_*`` are camelCase on purpose, for
  compatibility, and that one lint message is the only one allowed);
- every metric the rules and the dashboard query is one the gateway or the agent exports (names read
  from their live registries), or one of the few named kube-scheduler / Prometheus series, and every
  label they match on is one that series carries with the gateway's defaults;
- the chart's PrometheusRule and Grafana ConfigMap carry exactly these files.

The promtool tests skip when promtool is absent (Debian package ``prometheus``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpupool.cli.serve import build
from tests.adapters.http.servers import running

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gpupool-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "gpupool-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpupool.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)"
)

# Series that gpupool queries but does not export: Prometheus' own scrape health and kube-scheduler's
# scheduling-attempt metrics for the gpupool profile (the extender's errors and latency show there).
EXTERNAL = {
    "up",
    "scheduler_schedule_attempts_total",
    "scheduler_scheduling_attempt_duration_seconds_bucket",
}
CAMEL_OK = "label names should be written in 'snake_case' not 'camelCase'"
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _alerts() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def _rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for p in dash["panels"]:
        out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue  # the datasource picker's "query" is a plugin type, not PromQL
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if isinstance(q, str) and q:
            out.append(q)
    return out


_FUNCS_AND_KEYWORDS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "by",
    "without",
    "rate",
    "increase",
    "irate",
    "and",
    "or",
    "unless",
    "histogram_quantile",
    "le",
    "label_values",
    "on",
    "ignoring",
    "group_left",
    "clamp_min",
    "clamp_max",
    "topk",
    "bottomk",
    "changes",
    "delta",
    "deriv",
    "abs",
    "time",
    "vector",
    "bool",
    "offset",
    "max_over_time",
    "min_over_time",
    "avg_over_time",
    "resets",
    "sort_desc",
    "count_over_time",
}


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (label names inside {} and by () are dropped)."""
    e = _STRING.sub('""', expr)
    e = re.sub(r"label_values\(([^,()]+),[^)]*\)", r"\1", e)  # Grafana: label_values(metric, label)
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\$\w+", "", e)  # Grafana variables ($__rate_interval, $node)
    names = {m.group(0) for m in _NAME.finditer(e)}
    return {n for n in names if n not in _FUNCS_AND_KEYWORDS and not n.replace("_", "").isdigit()}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real gateway on the example cluster, with the tidal plane as `gpupool serve` attaches it by
    default (its series), and one simulated node agent per node; a lease, a queue wait and a pause so
    that the optional series appear too."""
    from gpupool.agent.runtime import start_simulated_agents
    from gpupool.cli.tidalplane import attach_tidal, load_plane_config

    data_dir = tmp_path_factory.mktemp("obs")
    bundle = build(data_dir=data_dir, simulate=True)
    attach_tidal(
        bundle, config=load_plane_config(None), data_dir=data_dir, clock=bundle.controller.clock, batch=False
    )
    token = bundle.new_admin_token
    assert token
    with running(bundle.app) as url:
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert c.post("/v1/leases", json={"priority": "P2", "vram_mib": 1024}).status_code == 201
        runtimes = start_simulated_agents(url, token=token, cluster=bundle.sim, metrics=True)
        try:
            deadline = time.monotonic() + 20
            agent_text = ""
            while time.monotonic() < deadline:
                port = runtimes[0].metrics_port
                agent_text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                if "gpupool_agent_gateway_connected" in agent_text and "DCGM_FI_DEV_FB_USED" in agent_text:
                    break
                time.sleep(0.2)
            gateway_text = httpx.get(f"{url}/metrics", timeout=5).text
            yield {
                "gateway_text": gateway_text,
                "agent_text": agent_text,
                "gateway_registry": bundle.app.state.gateway.metrics.registry,
                "agent_registry": runtimes[0].metrics.registry,
            }
        finally:
            for rt in runtimes:
                rt.stop()


def _exported(registry: Any) -> set[str]:
    """Every sample name a registry can expose, from its families' names and types."""
    out: set[str] = set()
    for fam in registry.collect():
        n = fam.name
        if fam.type == "counter":
            out |= {f"{n}_total", f"{n}_created"}
        elif fam.type == "histogram":
            out |= {f"{n}_bucket", f"{n}_sum", f"{n}_count", f"{n}_created"}
        else:
            out.add(n)
        out |= {s.name for s in fam.samples}
    return out


def _promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], check=False, input=stdin, capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rule_exprs())} rules found" in r.stdout


@needs_promtool
def test_promtool_unit_tests_of_every_alert() -> None:
    r = _promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for t in doc["tests"]:
        for a in t.get("alert_rule_test", []):
            (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
    assert fires == _alerts()
    assert quiet >= _alerts() - {"GpupoolAgentDown"}  # AgentDown's quiet case: a second agent that is up
    assert doc["rule_files"] == [RULES.name]


def _admission_series(text: str) -> list[dict[str, str]]:
    """The ``gpupool_admission_total`` samples of a ``/metrics`` page as promtool input series: 0 for
    two minutes, then the page's value for the rest of the half hour (one gateway, ``gw:8080``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gpupool_admission_total":
                lab = sorted({**s.labels, "instance": "gw:8080"}.items())
                labels = ",".join(f'{k}="{v}"' for k, v in lab)
                out.append({"series": f"{s.name}{{{labels}}}", "values": f"0 0 {int(s.value)}x28"})
    return out


def _fires(alert: str, band: str) -> dict[str, Any]:
    """A promtool expectation: ``alert`` fires at 5 min for ``band`` only, with its rule's annotations."""
    doc = yaml.safe_load(RULES.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert)
    notes = {k: v.replace("{{ $labels.band }}", band).strip() for k, v in rule["annotations"].items()}
    labels = {**rule["labels"], "band": band}
    fired = [{"exp_labels": labels, "exp_annotations": notes}]
    return {"eval_time": "5m", "alertname": alert, "exp_alerts": fired}


@needs_promtool
def test_a_full_queue_is_not_a_missed_deadline_on_the_gateways_own_series(tmp_path: Path) -> None:
    """A real controller sheds a P1 request because the P1 queue is full and a queued P0 request at its
    deadline; its real ``/metrics`` page, fed to the real rules, pages GpupoolQueueDeadlineMissed for
    P0 only and GpupoolQueueFull for P1 only."""
    from gpupool.adapters.metrics.gateway import GatewayMetrics
    from gpupool.adapters.store import MemoryLeaseStore
    from gpupool.core import P0, P1, ManualClock, OutcomeCode
    from gpupool.core.admission import AdmissionConfig
    from gpupool.core.controller import ControllerConfig, LeaseController
    from tests.builders import a_request, a_slice

    clock = ManualClock(1000.0)
    c = LeaseController(
        [a_slice("g0", gpu="g0", vram_gib=40)],
        clock=clock,
        store=MemoryLeaseStore(),
        config=ControllerConfig(admission=AdmissionConfig(max_per_band=1)),
    )
    assert c.acquire(a_request("full", vram_gib=40, priority=P0, preemptible=False, ttl_s=600)).granted
    assert c.acquire(a_request("a", priority=P1), wait_s=600.0).code is OutcomeCode.QUEUED
    full = c.acquire(a_request("b", priority=P1), wait_s=600.0)
    assert (full.code, full.reason) == (OutcomeCode.SHED, "queue of band P1 is full")
    assert c.acquire(a_request("c", priority=P0, preemptible=False), wait_s=5.0).code is OutcomeCode.QUEUED
    clock.advance(6.0)
    c.tick()  # c's deadline passed: shed
    text = GatewayMetrics(c).render()[0].decode()
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _admission_series(text),
                "alert_rule_test": [
                    _fires("GpupoolQueueDeadlineMissed", "P0"),
                    _fires("GpupoolQueueFull", "P1"),
                ],
            }
        ],
    }
    f = tmp_path / "admission.test.yaml"
    f.write_text(yaml.safe_dump(test, sort_keys=False))
    r = _promtool("test", "rules", str(f))
    assert r.returncode == 0, text + r.stdout + r.stderr


@needs_promtool
def test_promtool_check_metrics_on_the_gateway(live: dict[str, Any]) -> None:
    text = live["gateway_text"]
    assert "gpupool_slice_granted_vram_mib" in text
    r = _promtool("check", "metrics", stdin=text)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_check_metrics_on_the_agent(live: dict[str, Any]) -> None:
    text = live["agent_text"]
    assert "DCGM_FI_DEV_FB_USED" in text and "gpupool_agent_gateway_connected" in text
    r = _promtool("check", "metrics", stdin=text)
    problems = {line.split(" ", 1)[1] for line in (r.stdout + r.stderr).splitlines() if " " in line}
    assert problems <= {CAMEL_OK}, problems


def test_rules_and_dashboard_query_only_exported_metrics(live: dict[str, Any]) -> None:
    exported = _exported(live["gateway_registry"]) | _exported(live["agent_registry"])
    for where, exprs in (("rules", _rule_exprs()), ("dashboard", _dashboard_exprs())):
        assert exprs, where
        for e in exprs:
            unknown = metric_names(e) - exported - EXTERNAL
            assert not unknown, f"{where}: {e!r} queries {sorted(unknown)}, which nothing exports"


_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!=|!~|=)")


def _labels(registry: Any) -> dict[str, set[str]]:
    """Sample name -> the label names its exported samples carry."""
    out: dict[str, set[str]] = {}
    for fam in registry.collect():
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_rules_and_dashboard_match_only_labels_the_series_carry(live: dict[str, Any]) -> None:
    """A matcher on a label a series does not carry (with `gpupool serve`'s defaults) selects nothing:
    a panel that stays empty, an alert that never fires. ``tenant`` is such a label: the gateway
    adds it to ``gpupool_leases`` only with ``--metrics-tenant-labels``."""
    labels = _labels(live["gateway_registry"]) | _labels(live["agent_registry"])
    assert "tenant" not in labels["gpupool_leases"]
    for where, exprs in (("rules", _rule_exprs()), ("dashboard", _dashboard_exprs())):
        for e in exprs:
            for name, body in _SELECTOR.findall(_STRING.sub('""', e)):
                if name not in labels:
                    continue  # no sample yet (a counter never incremented), or an external series
                missing = set(_MATCHER.findall(body)) - labels[name]
                assert not missing, f"{where}: {e!r} matches {sorted(missing)}, which {name} does not carry"


def test_metric_name_extraction() -> None:
    """The extractor the test above relies on: names yes, labels, functions, ranges and strings no."""
    e = 'sum by (node, gpu) (rate(gpupool_lease_events_total{kind="granted",band=~"P0|P1"}[5m])) / up'
    assert metric_names(e) == {"gpupool_lease_events_total", "up"}
    q = 'histogram_quantile(0.99, sum by (le) (rate(x_bucket{a="b"}[$__rate_interval])))'
    assert metric_names(q) == {"x_bucket"}
    assert metric_names("label_values(gpupool_gpu_granted_vram_mib, node)") == {
        "gpupool_gpu_granted_vram_mib"
    }
