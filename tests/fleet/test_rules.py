"""deploy/: Prometheus configs, recording and alert rules, and their promtool tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.support import (
    ALERTS,
    ALERTS_SHORT,
    DEPLOY,
    RULES,
    alert_rules,
    binary,
    load_yaml,
    run,
    seconds,
)

RULE_FILES = sorted(RULES.glob("*.yml"))
ALERT_FILES = [ALERTS, ALERTS_SHORT]
TEST_FILES = sorted((DEPLOY / "tests").glob("*.yml"))
CONFIGS = [DEPLOY / "prometheus.yml", DEPLOY / "prometheus-native.yml"]

#: Gauges exported only by the holder of the metrics lease (a worker or the api):
#: every use must aggregate `instance` away, or a change of holder splits the series.
QUEUE_GAUGES = (
    "pgfleet_jobs_queued",
    "pgfleet_jobs_scheduled",
    "pgfleet_jobs_running",
    "pgfleet_oldest_queued_job_age_seconds",
    "pgfleet_jobs_dead",
    "pgfleet_workers_alive",
)


# --- promtool ---------------------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_promtool_check_config(config: Path) -> None:
    # dns_sd_configs are validated without resolving anything: no network needed.
    result = run([binary("promtool"), "check", "config", str(config)], cwd=DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules() -> None:
    result = run([binary("promtool"), "check", "rules", *map(str, RULE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


def test_promtool_test_rules() -> None:
    assert TEST_FILES
    result = run([binary("promtool"), "test", "rules", *map(str, TEST_FILES)], cwd=DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES)


# --- every alert is tested firing and quiet ------------------------------------------------


def coverage(rule_file: Path) -> tuple[set[str], set[str]]:
    """Alert names tested (firing, not firing) by the test files that load rule_file."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for test_file in TEST_FILES:
        spec = load_yaml(test_file)
        loaded = {(test_file.parent / f).resolve() for f in spec["rule_files"]}
        if rule_file.resolve() not in loaded:
            continue
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    return firing, quiet


@pytest.mark.parametrize("rule_file", ALERT_FILES, ids=lambda p: p.name)
def test_every_alert_is_tested_firing_and_not_firing(rule_file: Path) -> None:
    names = {r["alert"] for r in alert_rules(rule_file)}
    firing, quiet = coverage(rule_file)
    assert names - firing == set(), f"never tested firing: {sorted(names - firing)}"
    assert names - quiet == set(), f"never tested quiet: {sorted(names - quiet)}"
    assert firing | quiet <= names, f"tests name unknown alerts: {sorted((firing | quiet) - names)}"


# --- what the alerts are --------------------------------------------------------------------


def by_name(path: Path = ALERTS) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in alert_rules(path)}


def test_the_alerts_the_fleet_promises() -> None:
    rules = by_name()
    assert rules["PgfleetBacklogAgeHigh"]["labels"]["severity"] == "page"
    assert "by (kind)" in rules["PgfleetBacklogAgeHigh"]["expr"], "one alert per kind"
    assert rules["PgfleetBacklogAgeHigh"]["for"], "over a threshold for a duration"
    assert rules["PgfleetDeadJobsIncreasing"]["labels"]["severity"] == "ticket"
    assert "pgfleet_jobs_dead" in rules["PgfleetDeadJobsIncreasing"]["expr"]
    assert rules["PgfleetNoLiveWorkers"]["labels"]["severity"] == "page"
    assert "pgfleet_workers_alive" in rules["PgfleetNoLiveWorkers"]["expr"]
    assert 'up{job="pgfleet-worker"}' in rules["PgfleetNoLiveWorkers"]["expr"]
    assert "up{" in rules["PgfleetTargetDown"]["expr"]
    assert "absent(pgfleet_queue_collector_up)" in rules["PgfleetQueueCollectorAbsent"]["expr"]


@pytest.mark.parametrize("rule_file", ALERT_FILES, ids=lambda p: p.name)
def test_every_alert_has_a_severity_summary_and_description(rule_file: Path) -> None:
    for rule in alert_rules(rule_file):
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        for key in ("summary", "description"):
            assert rule["annotations"].get(key, "").strip(), (rule["alert"], key)


@pytest.mark.parametrize("rule_file", [*RULE_FILES], ids=lambda p: p.name)
def test_queue_gauges_are_always_aggregated_over_instances(rule_file: Path) -> None:
    for group in load_yaml(rule_file)["groups"]:
        for rule in group["rules"]:
            assert_aggregated(rule["expr"], rule.get("alert") or rule.get("record"))


def assert_aggregated(expr: str, where: str) -> None:
    for metric in QUEUE_GAUGES:
        for match in re.finditer(rf"\b{metric}\b", expr):
            before = expr[: match.start()]
            assert re.search(r"\bmax(?: by \(kind\) )?\($", before), (
                f"{where}: {metric} is not wrapped in max/max by (kind): {expr}"
            )


# --- alerts-test.yml: the same rules, shorter numbers ---------------------------------------

NUMBER = re.compile(r"\d+(?:\.\d+)?(?:ms|s|m|h|d|w|y)?")


def masked(rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "alert": rule["alert"],
        "expr": NUMBER.sub("#", " ".join(rule["expr"].split())),
        "for": NUMBER.sub("#", rule.get("for", "")),
        "labels": rule.get("labels", {}),
        "annotations": rule.get("annotations", {}),
    }


def test_short_threshold_rules_differ_from_production_only_in_numbers() -> None:
    production = [masked(r) for r in alert_rules(ALERTS)]
    short = [masked(r) for r in alert_rules(ALERTS_SHORT)]
    assert [r["alert"] for r in short] == [r["alert"] for r in production]
    for prod, test in zip(production, short, strict=True):
        assert test == prod, f"{prod['alert']}: alerts-test.yml drifted from alerts.yml"
    groups = [(g["name"], g.get("interval")) for g in load_yaml(ALERTS)["groups"]]
    assert [(g["name"], g.get("interval")) for g in load_yaml(ALERTS_SHORT)["groups"]] == groups


def test_short_threshold_rules_are_shorter() -> None:
    production = by_name(ALERTS)
    short = by_name(ALERTS_SHORT)
    for name, rule in short.items():
        assert seconds(rule["for"]) <= seconds(production[name]["for"]), name
        for test_number, prod_number in zip(
            NUMBER.findall(rule["expr"]), NUMBER.findall(production[name]["expr"]), strict=True
        ):
            assert to_seconds(test_number) <= to_seconds(prod_number), (name, test_number)
    backlog = short["PgfleetBacklogAgeHigh"]
    assert seconds(backlog["for"]) <= 15, "the acceptance test waits for this alert"


def to_seconds(number: str) -> float:
    return seconds(number) if number[-1].isalpha() else float(number)


# --- the two Prometheus configs ----------------------------------------------------------


def test_compose_config_discovers_every_worker_replica_by_dns() -> None:
    config = load_yaml(DEPLOY / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (worker_sd,) = jobs["pgfleet-worker"]["dns_sd_configs"]
    assert worker_sd == {**worker_sd, "names": ["worker"], "type": "A", "port": 9464}
    (api_sd,) = jobs["pgfleet-api"]["dns_sd_configs"]
    assert api_sd["names"] == ["api"] and api_sd["port"] == 9465
    assert config["rule_files"] == ["rules/recording.yml", "rules/alerts.yml"]


def test_native_config_scrapes_three_workers_and_the_api_on_loopback() -> None:
    config = load_yaml(DEPLOY / "prometheus-native.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    workers = [t for sc in jobs["pgfleet-worker"]["static_configs"] for t in sc["targets"]]
    assert workers == ["127.0.0.1:9464", "127.0.0.1:9465", "127.0.0.1:9466"]
    (api,) = [t for sc in jobs["pgfleet-api"]["static_configs"] for t in sc["targets"]]
    assert api.startswith("127.0.0.1:") and api not in workers
    assert api.split(":")[1] in (DEPLOY / "prometheus-native.yml").read_text().split("#", 1)[1]
    compose = load_yaml(DEPLOY / "prometheus.yml")
    assert config["rule_files"] == compose["rule_files"]
    assert set(jobs) == {job["job_name"] for job in compose["scrape_configs"]}
