"""Helpers for the fleet-artifact tests: paths, binaries, YAML, a real Prometheus."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "rules"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "pgfleet-fleet.json"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "worker" / "Dockerfile"

#: Alert rule files and their production counterparts.
ALERTS = RULES / "alerts.yml"
ALERTS_SHORT = RULES / "alerts-test.yml"

#: The reference application's job kinds (worker/app.py).
REFERENCE_JOB_NAMES = ("noop", "sleep", "cpu", "fail", "flaky", "send_email")


def binary(name: str) -> str:
    """The path of a required binary, or skip the test saying how to get it."""
    path = shutil.which(name)
    if path is None:
        package = {"promtool": "prometheus"}.get(name, name)
        pytest.skip(
            f"{name} is not on PATH (CI installs it: apt-get install {package}; "
            f".ci/run does so when it is missing)"
        )
    return path


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)


def load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def alert_rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in load_yaml(path)["groups"] for r in g["rules"] if "alert" in r]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' children included (row panels themselves excluded)."""
    for panel in dash["panels"]:
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


#: Grafana's template variables, as Prometheus-valid stand-ins.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "5m",
    "${kind}": ".*",
    "$kind": ".*",
}


def substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    if "$" in expr:
        raise AssertionError(f"unknown template variable left in {expr!r}")
    return expr


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def seconds(duration: str) -> float:
    """'5m' -> 300, '1h30m' -> 5400, '10s' -> 10."""
    match = _DURATION.match(str(duration))
    if not match or not any(match.groups()):
        raise ValueError(f"not a duration: {duration!r}")
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


def backlog_rule(path: Path = ALERTS) -> tuple[float, float]:
    """(threshold seconds, for seconds) of PgfleetBacklogAgeHigh in a rule file."""
    (rule,) = [r for r in alert_rules(path) if r["alert"] == "PgfleetBacklogAgeHigh"]
    match = re.fullmatch(
        r"max by \(kind\) \(pgfleet_oldest_queued_job_age_seconds"
        r" unless on \(kind\) \(pgfleet_jobs_waiting_on_limit > 0\)\) > (\d+(?:\.\d+)?)",
        rule["expr"].strip(),
    )
    assert match, f"unexpected backlog expression: {rule['expr']!r}"
    return float(match.group(1)), seconds(rule["for"])


class Prometheus:
    """A real Prometheus server on a loopback port, for as long as the test session."""

    def __init__(self, binary: str, config: Path, data: Path, log: Path) -> None:
        self.binary = binary
        self.config = config
        self.data = data
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @classmethod
    def running_at(cls, url: str) -> Prometheus:
        """A client of a Prometheus started elsewhere (queries only: no start/stop)."""
        prom = cls("", Path(), Path(), Path("/dev/null"))
        prom.url = url.rstrip("/")
        return prom

    def start(self, ready_timeout: float = 90.0) -> None:
        # The port is chosen before Prometheus binds it; on the rare collision, retry.
        for _ in range(3):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={self.config}",
                        f"--storage.tsdb.path={self.data}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            if self._wait_ready(ready_timeout):
                return
            self.stop()
        raise RuntimeError(f"prometheus did not become ready; log:\n{self.log()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)  # polling a condition, with a deadline
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/<path>; the decoded body, errors (HTTP 400/422) included."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        return body

    def query(self, expr: str) -> dict[str, Any]:
        return self.api("query", query=expr)

    def wait_for_rules(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Poll /api/v1/rules until done(rules) holds (or the deadline passes)."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.api("rules")
            assert body["status"] == "success", body
            rules = [r for g in body["data"]["groups"] for r in g["rules"]]
            if done(rules) or time.monotonic() > deadline:
                return rules
            time.sleep(0.2)  # polling a condition, with a deadline

    def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns series (or the deadline passes)."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            body = self.query(expr)
            assert body["status"] == "success", (expr, body)
            result = body["data"]["result"]
            if result:
                return result
            time.sleep(0.2)  # polling a condition, with a deadline
        return result


def env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
