"""grafana/: the fleet dashboard and the provisioning files.

The live tests run every panel query against a real Prometheus (see conftest.py)
that scrapes pgfleet's own metric objects: each query must parse, and return series.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.fleet.support import (
    GRAFANA,
    REFERENCE_JOB_NAMES,
    Prometheus,
    alert_rules,
    backlog_rule,
    dashboard,
    load_yaml,
    panels,
    seconds,
    substitute,
)
from tests.fleet.test_rules import assert_aggregated

DASH = dashboard()
PANELS = list(panels(DASH))
TARGETS = [(p["title"], t) for p in PANELS for t in p["targets"]]
AGE_PANEL = "Oldest queued job age per kind"

#: Panels the issue asks for, by title.
REQUIRED_PANELS = (
    "Queued jobs per kind",
    "Scheduled jobs per kind",
    "Running jobs per kind",
    AGE_PANEL,
    "Dead jobs per kind",
    "Handler duration p50 / p95 / p99 per kind",
    "Throughput by outcome",
    "Pickup delay p50 / p95 / p99",
    "Workers alive",
    "Active jobs vs concurrency",
    "Wakeups by source",
)
#: Panels whose every query must return one series per reference kind.
PER_KIND_PANELS = (
    "Queued jobs per kind",
    "Scheduled jobs per kind",
    "Running jobs per kind",
    AGE_PANEL,
    "Dead jobs per kind",
    "Handler duration p50 / p95 / p99 per kind",
    "Enqueued per kind",
)


def alerting() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(GRAFANA / "provisioning/alerting/pgfleet-backlog.yml")
    return data


def panel(title: str) -> dict[str, Any]:
    (found,) = [p for p in PANELS if p["title"] == title]
    return found


# --- dashboard facts ----------------------------------------------------------------------


def test_dashboard_has_a_stable_uid_and_title() -> None:
    assert DASH["uid"] == "pgfleet-fleet"
    assert DASH["title"] == "pgfleet fleet"
    assert DASH.get("id") is None, "provisioned dashboards carry no database id"


def test_dashboard_has_a_datasource_and_a_kind_variable() -> None:
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    kind = variables["kind"]
    assert kind["type"] == "query"
    assert kind["query"] == "label_values(pgfleet_jobs_queued, kind)"
    assert kind["datasource"]["uid"] == "${datasource}"
    assert kind["multi"] and kind["includeAll"] and kind["allValue"] == ".*"


def test_every_panel_queries_the_selected_datasource_with_an_expression() -> None:
    assert PANELS
    for p in PANELS:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for target in p["targets"]:
            assert target.get("expr", "").strip(), p["title"]
            assert target["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def test_panels_have_unique_ids_and_titles_and_do_not_overlap() -> None:
    ids = [p["id"] for p in PANELS]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in PANELS]
    assert len(titles) == len(set(titles))
    cells: dict[tuple[int, int], str] = {}
    for p in PANELS:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_the_panels_the_fleet_promises_are_there() -> None:
    titles = {p["title"] for p in PANELS}
    assert set(REQUIRED_PANELS) <= titles
    for title in REQUIRED_PANELS:
        assert panel(title).get("description"), title


def test_duration_and_pickup_panels_show_p50_p95_p99_from_histograms() -> None:
    for title, metric in (
        ("Handler duration p50 / p95 / p99 per kind", "pgfleet_job_duration_seconds_bucket"),
        ("Pickup delay p50 / p95 / p99", "pgfleet_job_pickup_delay_seconds_bucket"),
    ):
        exprs = [t["expr"] for t in panel(title)["targets"]]
        quantiles = sorted(re.findall(r"^histogram_quantile\((0\.\d+),", "\n".join(exprs), re.M))
        assert quantiles == ["0.50", "0.95", "0.99"], title
        for expr in exprs:
            assert f"rate({metric}{{" in expr and "[$__rate_interval]" in expr, expr
            assert "le)" in expr, "quantiles need the le label kept"


def test_queue_panels_aggregate_the_lease_holder_instance_away() -> None:
    for title, target in TARGETS:
        assert_aggregated(target["expr"], title)


def test_backlog_age_panel_draws_the_alert_threshold() -> None:
    threshold, _for = backlog_rule()
    defaults = panel(AGE_PANEL)["fieldConfig"]["defaults"]
    steps = defaults["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, threshold]
    assert steps[-1]["color"] == "red"
    assert defaults["custom"]["thresholdsStyle"]["mode"] in ("line", "line+area", "dashed")
    assert defaults["unit"] == "s"


# --- provisioning ----------------------------------------------------------------------------


def test_datasource_points_at_the_compose_prometheus() -> None:
    (source,) = load_yaml(GRAFANA / "provisioning/datasources/prometheus.yml")["datasources"]
    assert source["type"] == "prometheus"
    assert source["uid"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert source["isDefault"] is True


def test_grafana_backlog_alert_matches_the_prometheus_rule_and_the_dashboard() -> None:
    threshold, for_seconds = backlog_rule()
    (group,) = alerting()["groups"]
    (rule,) = group["rules"]
    queries = {q["refId"]: q for q in rule["data"]}
    (prometheus_rule,) = [r for r in alert_rules_production() if r["alert"] == rule["title"]]
    expr = prometheus_rule["expr"].rsplit(">", 1)[0].strip()
    assert queries["A"]["model"]["expr"] == expr
    assert queries["A"]["datasourceUid"] == "prometheus"
    (condition,) = queries[rule["condition"]]["model"]["conditions"]
    assert condition["evaluator"] == {"type": "gt", "params": [threshold]}
    assert seconds(rule["for"]) == for_seconds
    assert rule["labels"] == prometheus_rule["labels"]
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert rule["dashboardUid"] == DASH["uid"]
    assert rule["panelId"] == panel(AGE_PANEL)["id"]


def alert_rules_production() -> list[dict[str, Any]]:
    from tests.fleet.support import ALERTS

    return alert_rules(ALERTS)


# --- against a real Prometheus -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "expr"),
    [(title, t["expr"]) for title, t in TARGETS],
    ids=[f"{title}/{t['refId']}" for title, t in TARGETS],
)
def test_every_panel_query_parses_and_runs(prometheus: Prometheus, title: str, expr: str) -> None:
    body = prometheus.query(substitute(expr))
    assert body["status"] == "success", f"{title}: {body.get('error')}"


@pytest.mark.parametrize(
    ("title", "expr"),
    [(title, t["expr"]) for title, t in TARGETS],
    ids=[f"{title}/{t['refId']}" for title, t in TARGETS],
)
def test_every_panel_query_finds_pgfleet_series(
    prometheus: Prometheus, title: str, expr: str
) -> None:
    result = prometheus.wait_for(substitute(expr))
    assert result, f"{title}: no series for {expr} (is a metric or label misnamed?)"
    if title in PER_KIND_PANELS:
        kinds = {series["metric"].get("kind") for series in result}
        assert set(REFERENCE_JOB_NAMES) <= kinds, (title, kinds)


def test_kind_variable_lists_the_reference_kinds(prometheus: Prometheus) -> None:
    prometheus.wait_for("pgfleet_jobs_queued")
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable("kind")["query"])
    assert match
    body = prometheus.api(f"label/{match.group(2)}/values", **{"match[]": match.group(1)})
    assert body["status"] == "success"
    assert set(REFERENCE_JOB_NAMES) <= set(body["data"])


def variable(name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [v for v in DASH["templating"]["list"] if v["name"] == name]
    (found,) = matches
    return found


def test_grafana_alert_query_runs(prometheus: Prometheus) -> None:
    (rule,) = alerting()["groups"][0]["rules"]
    expr = rule["data"][0]["model"]["expr"]
    assert {s["metric"]["kind"] for s in prometheus.wait_for(expr)} >= set(REFERENCE_JOB_NAMES)


def test_recording_and_alert_rules_evaluate_without_errors(prometheus: Prometheus) -> None:
    """Parsing is promtool's job; this catches evaluation errors (many-to-many matches...)."""
    expected = sum(len(g["rules"]) for f in ("recording.yml", "alerts.yml") for g in rules_of(f))
    prometheus.wait_for("pgfleet_jobs_dead")  # scraped: the rules have data to work on
    rules = prometheus.wait_for_rules(
        lambda rules: len(rules) == expected and all(r["health"] != "unknown" for r in rules)
    )
    assert len(rules) == expected
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    records = {r["name"]: r for r in rules if r["type"] == "recording"}
    assert records, "recording rules loaded"


def rules_of(name: str) -> list[dict[str, Any]]:
    from tests.fleet.support import RULES

    groups: list[dict[str, Any]] = load_yaml(RULES / name)["groups"]
    return groups
