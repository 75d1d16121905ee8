"""What the native fleet runs, where, and the Prometheus configuration it uses."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "rules"
#: The checked-in Prometheus config for the default ports (see its comments).
NATIVE_PROMETHEUS_CONFIG = DEPLOY / "prometheus-native.yml"

#: The reference application (worker/app.py) and its cron schedules.
APP = "worker.app:registry"
CRONS = "worker.app:crons"


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the fleet. Worker process i serves metrics on ``workers + i``."""

    api: int = 8000
    api_metrics: int = 9475
    workers: int = 9464
    prometheus: int = 9090

    def worker_ports(self, processes: int) -> list[int]:
        return [self.workers + i for i in range(processes)]

    def check(self, processes: int) -> None:
        used = [self.api, self.api_metrics, self.prometheus, *self.worker_ports(processes)]
        for port in used:
            if not 1 <= port <= 65535:
                raise ValueError(f"port out of range: {port}")
        if len(set(used)) != len(used):
            raise ValueError(
                f"ports overlap: api {self.api}, api metrics {self.api_metrics}, "
                f"prometheus {self.prometheus}, workers {self.worker_ports(processes)}"
            )


@dataclass(frozen=True)
class FleetConfig:
    """The native fleet's settings; the defaults are what ``make fleet`` runs."""

    #: PostgreSQL to use; None starts an embedded server (pgserver) in state_dir/pgdata.
    database_url: str | None = None
    #: Embedded database, Prometheus data, generated config and logs.
    state_dir: Path = ROOT / ".fleet"
    #: Worker processes, under one ``pgfleet worker --processes N`` supervisor.
    processes: int = 3
    ports: Ports = field(default_factory=Ports)
    #: Run Prometheus (when the binary is on PATH).
    prometheus: bool = True
    #: Prometheus scrape and rule evaluation interval, seconds.
    scrape_interval: float = 5.0
    #: The alert rule file Prometheus loads (alerts-test.yml: short thresholds).
    alert_rules: Path = RULES / "alerts.yml"
    #: Jobs per second the demo producer posts to the API (0: no producer).
    rate: float = 20.0
    #: The producer's bearer token; None: no auth. Alone (no api_credentials), it is
    #: the one-token setup: the API's only credential, an operator (PGFLEET_API_TOKEN).
    api_token: str | None = None
    #: The API's credentials (PGFLEET_API_CREDENTIALS); the fleet makes a producer
    #: and an operator when no token is given.
    api_credentials: str | None = None
    #: Serve the operator console at /ui of the API (operators sign in to it).
    ui: bool = True
    #: Extra flags for ``pgfleet worker`` (e.g. ``("--concurrency", "8")``).
    worker_args: tuple[str, ...] = ()
    #: Seconds each process may take to start (and answer its health check).
    start_timeout: float = 120.0
    #: Seconds workers and API get to drain at stop before they are told to hurry.
    stop_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"processes must be at least 1, got {self.processes}")
        if self.rate < 0:
            raise ValueError(f"rate must not be negative, got {self.rate}")
        if self.scrape_interval < 1:
            raise ValueError(f"scrape interval must be at least 1 s, got {self.scrape_interval}")
        self.ports.check(self.processes)

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def prometheus_config(config: FleetConfig) -> dict[str, object]:
    """The native Prometheus configuration for these ports, intervals and rules.

    With the defaults it is deploy/prometheus-native.yml (a test keeps them equal):
    the same job names and rule files as the compose config, so the dashboard and
    alert rules work on both."""
    interval = config.scrape_interval
    ports = config.ports
    return {
        "global": {
            "scrape_interval": _duration(interval),
            "scrape_timeout": _duration(max(interval - 1, interval * 0.8)),
            "evaluation_interval": _duration(interval),
            "external_labels": {"fleet": "pgfleet-native"},
        },
        "rule_files": [str(RULES / "recording.yml"), str(config.alert_rules.resolve())],
        "scrape_configs": [
            {
                "job_name": "pgfleet-worker",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{p}" for p in ports.worker_ports(config.processes)],
                        "labels": {"service": "worker"},
                    }
                ],
            },
            {
                "job_name": "pgfleet-api",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{ports.api_metrics}"], "labels": {"service": "api"}}
                ],
            },
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{ports.prometheus}"]}],
            },
        ],
    }


def uses_checked_in_config(config: FleetConfig) -> bool:
    """True when deploy/prometheus-native.yml describes this fleet as it is."""
    default = FleetConfig()
    return (
        config.ports == default.ports
        and config.processes == default.processes
        and config.scrape_interval == default.scrape_interval
        and config.alert_rules.resolve() == default.alert_rules.resolve()
    )


def write_prometheus_config(config: FleetConfig) -> Path:
    """The config file Prometheus should load: the checked-in one for the default
    fleet, else one generated into the state directory (JSON, which is YAML)."""
    if uses_checked_in_config(config):
        return NATIVE_PROMETHEUS_CONFIG
    path = config.state_dir / "prometheus.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(prometheus_config(config), indent=2)
    path.write_text(
        "# Generated by tools/fleet for non-default ports, intervals or rules; the\n"
        "# default fleet uses deploy/prometheus-native.yml. Overwritten at every start.\n"
        + text
        + "\n"
    )
    return path


PRODUCER_TOKEN = "producer-token"
OPERATOR_TOKEN = "operator-token"


def made_token(state_dir: Path, name: str) -> str:
    """A credential's secret the fleet made: made once, kept in ``state_dir/name``
    (readable by this user only) so console logins and producers survive restarts."""
    import secrets

    path = state_dir / name
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    state_dir.mkdir(parents=True, exist_ok=True)
    token = "pgf_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token


def made_credentials(state_dir: Path) -> tuple[str, str]:
    """(the producer's token, PGFLEET_API_CREDENTIALS) of a fleet started without a
    token: a producer (the demo producer) and an operator (the console)."""
    producer = made_token(state_dir, PRODUCER_TOKEN)
    operator = made_token(state_dir, OPERATOR_TOKEN)
    return producer, f"producer:producer:{producer},operator:operator:{operator}"
