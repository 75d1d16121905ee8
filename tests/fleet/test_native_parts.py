"""tools/fleet without processes: its Prometheus config, the demo mix, the summary."""

from __future__ import annotations

import collections
import dataclasses
import random
from pathlib import Path

import pytest

from pgfleet.service.api_schema import Limits, parse_enqueue
from tests.fleet.support import ALERTS_SHORT, DEPLOY, REFERENCE_JOB_NAMES, binary, load_yaml, run
from tools.fleet import FleetConfig, Ports, mixed_job, prometheus_config, uses_checked_in_config
from tools.fleet.config import write_prometheus_config
from tools.fleet.producer import JOB_NAMES
from tools.fleet.summary import Totals, parse


def test_the_default_fleet_runs_prometheus_on_the_checked_in_native_config() -> None:
    """make fleet loads deploy/prometheus-native.yml as it is; the generator (for other
    ports, intervals or rules) must produce the same thing for the defaults."""
    default = FleetConfig()
    assert uses_checked_in_config(default)
    assert write_prometheus_config(default) == DEPLOY / "prometheus-native.yml"
    checked_in = load_yaml(DEPLOY / "prometheus-native.yml")
    checked_in["rule_files"] = [str((DEPLOY / f).resolve()) for f in checked_in["rule_files"]]
    assert prometheus_config(default) == checked_in


@pytest.mark.parametrize(
    "change",
    [
        {"ports": Ports(api_metrics=9480)},
        {"processes": 4},
        {"scrape_interval": 1.0},
        {"alert_rules": ALERTS_SHORT},
    ],
    ids=["ports", "processes", "interval", "rules"],
)
def test_any_other_fleet_gets_a_generated_config(tmp_path: Path, change: dict[str, object]) -> None:
    config = dataclasses.replace(FleetConfig(state_dir=tmp_path), **change)  # type: ignore[arg-type]
    assert not uses_checked_in_config(config)
    assert write_prometheus_config(config) == tmp_path / "prometheus.yml"


def test_generated_config_follows_ports_processes_interval_and_rules(tmp_path: Path) -> None:
    config = FleetConfig(
        state_dir=tmp_path,
        processes=2,
        ports=Ports(api=7000, api_metrics=7001, workers=7010, prometheus=7002),
        scrape_interval=1,
        alert_rules=ALERTS_SHORT,
    )
    written = load_yaml(write_prometheus_config(config))
    assert written == prometheus_config(config)
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in written["scrape_configs"]}
    assert jobs == {
        "pgfleet-worker": ["127.0.0.1:7010", "127.0.0.1:7011"],
        "pgfleet-api": ["127.0.0.1:7001"],
        "prometheus": ["127.0.0.1:7002"],
    }
    assert written["global"]["scrape_interval"] == "1s"
    assert written["global"]["evaluation_interval"] == "1s"
    assert written["global"]["scrape_timeout"] == "800ms"
    assert written["rule_files"][1] == str(ALERTS_SHORT.resolve())


def test_promtool_accepts_a_generated_config(tmp_path: Path) -> None:
    promtool = binary("promtool")
    config = FleetConfig(
        state_dir=tmp_path,
        ports=Ports(api=7000, api_metrics=7001, workers=7010, prometheus=7002),
        scrape_interval=1,
        alert_rules=ALERTS_SHORT,
    )
    result = run([promtool, "check", "config", str(write_prometheus_config(config))])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"ports": Ports(api=9464)}, "ports overlap"),
        ({"ports": Ports(prometheus=9466)}, "ports overlap"),
        ({"processes": 12, "ports": Ports(api_metrics=9475)}, "ports overlap"),
        ({"ports": Ports(api=0)}, "port out of range"),
        ({"processes": 0}, "processes must be at least 1"),
        ({"rate": -1}, "rate must not be negative"),
        ({"scrape_interval": 0.5}, "scrape interval must be at least 1 s"),
    ],
)
def test_config_refuses_settings_that_cannot_work(
    settings: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        FleetConfig(**settings)  # type: ignore[arg-type]


def test_demo_mix_covers_the_reference_kinds_and_the_api_accepts_it() -> None:
    assert set(JOB_NAMES) == set(REFERENCE_JOB_NAMES)
    rng = random.Random(6)
    jobs = [mixed_job(rng) for _ in range(2000)]
    kinds = collections.Counter(job["name"] for job in jobs)
    assert set(kinds) == set(REFERENCE_JOB_NAMES)
    assert kinds["fail"] < kinds["flaky"] < kinds["noop"]  # failures are the minority
    body = parse_enqueue({"jobs": jobs[:1000]}, Limits())
    assert [r.name for r in body.requests] == [j["name"] for j in jobs[:1000]]


def test_totals_survive_a_process_restarting_its_counters() -> None:
    totals = Totals()
    totals.observe("a", {"succeeded": 10, "failed": 1})
    totals.observe("b", {"succeeded": 5})
    totals.observe("a", {"succeeded": 12, "failed": 1})
    totals.observe("a", {"succeeded": 3, "failed": 0})  # restarted: counts from zero
    assert totals.by_outcome == {"succeeded": 10 + 5 + 2 + 3, "failed": 1}


def test_summary_reads_finished_attempts_and_queue_gauges() -> None:
    text = (
        "# TYPE pgfleet_jobs_finished_total counter\n"
        'pgfleet_jobs_finished_total{kind="noop",outcome="succeeded"} 7.0\n'
        'pgfleet_jobs_finished_total{kind="fail",outcome="failed"} 2.0\n'
        'pgfleet_jobs_finished_total{kind="sleep",outcome="succeeded"} 3.0\n'
        "# TYPE pgfleet_jobs_queued gauge\n"
        'pgfleet_jobs_queued{kind="noop"} 4.0\n'
        "# TYPE pgfleet_oldest_queued_job_age_seconds gauge\n"
        'pgfleet_oldest_queued_job_age_seconds{kind="noop"} 1.5\n'
    )
    finished, gauges = parse(text)
    assert finished == {"succeeded": 10.0, "failed": 2.0}
    assert gauges == {
        "pgfleet_jobs_queued": {"noop": 4.0},
        "pgfleet_oldest_queued_job_age_seconds": {"noop": 1.5},
    }


def test_the_fleets_credentials_are_made_once_readable_by_their_owner_only(
    tmp_path: Path,
) -> None:
    from pgfleet.service.credentials import Role, load
    from tools.fleet.config import made_credentials

    state = tmp_path / "fleet"
    producer, entries = made_credentials(state)
    creds = load(entries=entries)  # strong enough for pgfleet api
    assert creds.authenticate(producer).role is Role.PRODUCER  # type: ignore[union-attr]
    operator = (state / "operator-token").read_text().strip()
    assert creds.authenticate(operator).role is Role.OPERATOR  # type: ignore[union-attr]
    for name in ("producer-token", "operator-token"):
        assert (state / name).stat().st_mode & 0o777 == 0o600
    # Kept across runs: logins survive restarts.
    assert made_credentials(state) == (producer, entries)


def test_the_banner_says_where_the_console_is_and_how_to_sign_in(tmp_path: Path) -> None:
    import io

    from tools.fleet import NativeFleet
    from tools.fleet.__main__ import build_parser, config_from

    base = FleetConfig(database_url="postgresql://u@127.0.0.1/db", state_dir=tmp_path, rate=0)
    fleet = NativeFleet(dataclasses.replace(base, api_token="t0k"), out=io.StringIO())
    fleet.token_file = True
    banner = fleet.banner()
    assert "console     http://127.0.0.1:8000/ui/" in banner and "operator-token" in banner
    assert "Authorization: Bearer $(cat " in banner and "t0k" not in banner
    off = NativeFleet(dataclasses.replace(base, ui=False), out=io.StringIO()).banner()
    assert "console" not in off
    assert config_from(build_parser().parse_args(["--no-ui"])).ui is False
    assert config_from(build_parser().parse_args([])).ui is True
