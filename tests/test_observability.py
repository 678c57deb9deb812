"""The Grafana dashboard and the Prometheus alert rules shipped in docker/ query only metrics
the processes export: the names are collected from the metric definitions themselves (the
worker's and the oracle's registries, with the process collector), plus Prometheus' ``up``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from percolator.observers.worker_metrics import LOCK_OUTCOMES, WorkerMetrics
from percolator.oracle.lease import Role
from percolator.oracle.metrics import OracleMetrics

from percolator.metrics import parse_text

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docker" / "grafana" / "percolator-dashboard.json"
ALERTS = ROOT / "docker" / "prometheus" / "alerts.yml"
PROMETHEUS = ROOT / "docker" / "prometheus" / "prometheus.yml"

#: PromQL words that are not metric names when they are not followed by "("
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
#: clauses whose parentheses hold label names, not expressions
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries, $__rate_interval
    text = _LABEL_LISTS.sub("", text)
    text = re.sub(r"\$\w+", "", text)  # Grafana variables elsewhere
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("("):
            continue  # a function or an aggregation
        before = text[: match.start()]
        if before and (before[-1].isdigit() or before[-1] == "."):
            continue  # the exponent or unit of a number
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def test_the_expression_reader() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (observer, le) (rate(a_bucket{job="x"}[5m]))) > 5'
    ) == {"a_bucket"}
    assert metric_names('sum(up{job=~"p-.*"}) < 1 or absent(up)') == {"up"}
    assert metric_names("x - y and on (instance) z == 1") == {"x", "y", "z"}
    assert metric_names("rate(c_total[$__rate_interval]) * 60") == {"c_total"}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name the worker and the oracle expose, and ``up``."""
    worker = WorkerMetrics(lambda: {(("observer", "o"),): 1.0}, lambda: {(("observer", "o"),): 0})
    worker.registry.declare(observer=["o"], outcome=LOCK_OUTCOMES)
    info = SimpleNamespace(epoch=1, high_water=2, last_issued=1, renewals=0, fenced=0)
    node = SimpleNamespace(info=lambda: info, role=Role.ACTIVE)
    oracle = OracleMetrics(node)  # type: ignore[arg-type]
    names = {"up"}
    for registry in (worker.registry, oracle.registry):
        for key in parse_text(registry.render()):
            names.add(key.split("{", 1)[0])
    # The process collector is part of every registry (Linux): the dashboard shows these.
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    return names


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for panel in panels:
        found.append(panel)
        found += _panels(panel.get("panels", []))
    return found


def test_every_dashboard_query_names_an_exported_metric(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = _panels(dashboard["panels"])
    queries = [
        (panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])
    ]
    queries += [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    assert len(queries) >= 20
    unknown = {
        title: sorted(metric_names(expr) - exported)
        for title, expr in queries
        if metric_names(expr) - exported
    }
    assert unknown == {}
    assert all(metric_names(expr) for _, expr in queries)  # each query selects something
    # Every metric the processes define is on the dashboard somewhere (bar the runtime's).
    shown = set().union(*(metric_names(expr) for _, expr in queries))
    ours = {n for n in exported if n.startswith("percolator_")}
    histograms = {n.removesuffix("_bucket") for n in ours if n.endswith("_bucket")}
    missing = {
        n
        for n in ours
        if n not in shown
        and not n.endswith("_created")
        and not any(n.startswith(h) for h in histograms if h + "_bucket" in shown)
    }
    assert missing == set()


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "percolator-overview" and dashboard["title"]
    panels = _panels(dashboard["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    (variable,) = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"]) == ("datasource", "datasource")


_DURATION = re.compile(r"\d+[smhdwy]")


def test_every_alert_rule_names_an_exported_metric(exported: set[str]) -> None:
    rules = [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert metric_names(rule["expr"]), rule["alert"]
        assert metric_names(rule["expr"]) <= exported, (rule["alert"], rule["expr"])
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]
        if "for" in rule:
            assert _DURATION.fullmatch(rule["for"]), rule["alert"]
    # What the issue asks to alert on: backlog, parked, fail-over, worker liveness.
    covered = set().union(*(metric_names(rule["expr"]) for rule in rules))
    assert {
        "percolator_observer_backlog",
        "percolator_observer_parked",
        "percolator_oracle_epoch",
        "percolator_oracle_active",
        "up",
    } <= covered


def test_prometheus_config_scrapes_the_jobs_the_rules_select() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"percolator-worker", "percolator-oracle"}
    text = ALERTS.read_text() + DASHBOARD.read_text()
    assert set(re.findall(r'job=\\?"([\w-]+)\\?"', text)) <= jobs
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]


# ------------------------------------------------------- promtool, where it is installed

# `make test` installs promtool (Debian's package prometheus) when it is missing; without it
# these tests fail rather than skip, so a machine that cannot check the rules says so.
PROMTOOL = shutil.which("promtool")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if PROMTOOL is None:
        pytest.fail("promtool is not installed: `make test` installs Debian's package prometheus")
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", "alerts.yml", cwd=ALERTS.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml", cwd=ALERTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_accepts_the_config_and_every_dashboard_query(tmp_path: Path) -> None:
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    config = PROMETHEUS.read_text().replace("/etc/prometheus/alerts.yml", "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(config)
    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Each dashboard query as a recording rule: promtool parses every expression.
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    rules = [
        {"record": f"dashboard:query{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(exprs)
    ]
    (tmp_path / "dashboard.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    parsed = promtool("check", "rules", "dashboard.yml", cwd=tmp_path)
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr
