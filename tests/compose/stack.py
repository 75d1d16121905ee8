"""Drive docker-compose.yml through a real Docker engine and Compose v2.

``Stack`` runs ``docker compose`` with a project name of its own (so a developer's
own ``docker compose up`` is left alone), a throwaway env file (so ``./.env`` is never
read), free published ports and, on the docker-lab machines (no image registry), an
override adapted from the lab's (``$PGFLEET_LAB_COMPOSE_FILE``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"

T = TypeVar("T")

#: Variables of docker-compose.yml that a developer's environment must not bring in.
COMPOSE_VARIABLES = (
    "POSTGRES_PASSWORD",
    "GRAFANA_ADMIN_PASSWORD",
    "PGFLEET_API_TOKEN",
    "PGFLEET_PRODUCER_TOKEN",
    "PGFLEET_OPERATOR_TOKEN",
    "PGFLEET_API_TRUSTED_PROXIES",
    "PGFLEET_UI_SECURE_COOKIES",
    "PGFLEET_API_BIND",
    "PGFLEET_API_PUBLISHED_PORT",
    "GRAFANA_BIND",
    "GRAFANA_PUBLISHED_PORT",
    "GRAFANA_ADMIN_USER",
    "PGFLEET_IMAGE_TAG",
    "PGFLEET_CONCURRENCY",
    "PGFLEET_LOG_LEVEL",
    "LOCUST_USERS",
    "LOCUST_SPAWN_RATE",
    "LOCUST_RUN_TIME",
    "LOCUST_UID",
    "LOCUST_GID",
    "COMPOSE_PROJECT_NAME",
    "COMPOSE_FILE",
    "COMPOSE_PROFILES",
)


class CommandFailed(AssertionError):
    pass


def engine_problem() -> str | None:
    """None when a Docker engine answers, else why not (the reason to skip)."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    try:
        result = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "`docker version` did not answer in 30 s"
    if result.returncode != 0 or not result.stdout.strip():
        return f"no Docker engine answers: {result.stderr.strip()[-300:]}"
    return None


def versions() -> dict[str, str]:
    """Engine and Compose versions (Compose v2 is required once an engine answers)."""
    engine = run(["docker", "version", "--format", "{{.Server.Version}}"]).stdout.strip()
    compose = subprocess.run(
        ["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=30
    )
    if compose.returncode != 0:
        raise CommandFailed(
            "a Docker engine answers but `docker compose` (Compose v2) does not: "
            f"{compose.stderr.strip()} (install the docker-compose-plugin)"
        )
    return {"engine": engine, "compose": compose.stdout.strip()}


def run(
    args: list[str],
    *,
    timeout: float = 120,
    check: bool = True,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            input=input,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(
            f"{' '.join(args)} did not finish in {timeout} s\n{_tail(exc.stdout)}\n{_tail(exc.stderr)}"
        ) from exc
    if check and result.returncode != 0:
        raise CommandFailed(
            f"{' '.join(args)} exited {result.returncode}\n"
            f"--- stdout\n{_tail(result.stdout)}\n--- stderr\n{_tail(result.stderr)}"
        )
    return result


def _tail(text: str | bytes | None, lines: int = 60) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    what: str, probe: Callable[[], T | None], timeout: float, interval: float = 1.0
) -> T:
    """Call ``probe`` until it returns something other than None (or time runs out)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value is not None:
                return value
        except (CommandFailed, OSError, ValueError, KeyError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f"; last error: {last_error}" if last_error else "")
            )
        time.sleep(interval)


@dataclass
class Steps:
    """Named steps with their wall time, reported as they finish."""

    report: Callable[[str], None]
    done: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.report(f"[compose smoke] {name} ...")
        start = time.monotonic()
        try:
            yield
        except BaseException:
            self.report(f"[compose smoke] FAILED: {name} after {time.monotonic() - start:.1f} s")
            raise
        elapsed = time.monotonic() - start
        self.done.append((name, elapsed))
        self.report(f"[compose smoke] ok {elapsed:6.1f} s  {name}")

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.report(f"[compose smoke] {text}")


class Stack:
    """One compose project of docker-compose.yml, torn down with ``down -v``."""

    def __init__(self, workdir: Path, tag: str = "smoke") -> None:
        self.project = f"pgfleet-smoke-{os.getpid()}"
        # The operator's: the smoke test enqueues, reads and manages jobs.
        self.token = "smoke-operator-" + os.urandom(12).hex()
        self.producer_token = "smoke-producer-" + os.urandom(12).hex()
        self.postgres_password = "smoke-" + os.urandom(12).hex()
        self.api_port = free_port()
        self.tag = tag
        self.image = f"pgfleet:{tag}"
        self.loadtest_image = f"pgfleet-loadtest:{tag}"
        self.lab = os.environ.get("PGFLEET_LAB_COMPOSE_FILE")
        values = {
            "POSTGRES_PASSWORD": self.postgres_password,
            "GRAFANA_ADMIN_PASSWORD": "smoke-" + os.urandom(12).hex(),
            "PGFLEET_OPERATOR_TOKEN": self.token,
            "PGFLEET_PRODUCER_TOKEN": self.producer_token,
            "PGFLEET_API_PUBLISHED_PORT": str(self.api_port),
            "GRAFANA_PUBLISHED_PORT": str(free_port()),
            "PGFLEET_IMAGE_TAG": tag,
        }
        env_file = workdir / "compose.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        self.files = [COMPOSE]
        if self.lab:
            self.files.append(self._lab_override(Path(self.lab), workdir / "lab-override.yml"))
        self.env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES}
        self.env.update(values)
        self.base = ["docker", "compose", "--env-file", str(env_file), "-p", self.project]
        for f in self.files:
            self.base += ["-f", str(f)]
        self.services: list[str] = sorted(
            name
            for name, svc in yaml.safe_load(COMPOSE.read_text())["services"].items()
            if "profiles" not in svc
        )
        if self.lab:
            override = yaml.safe_load(self.files[-1].read_text()) or {}
            parked = {n for n, s in override.get("services", {}).items() if "profiles" in s}
            self.services = [s for s in self.services if s not in parked]

    @staticmethod
    def _lab_override(lab: Path, out: Path) -> Path:
        """The lab's override, its build settings kept only for services that build.

        The lab file gives every pgfleet service `build: {network: host}`; a service of
        ours without a build section would then build (from nothing) too.
        """
        ours = yaml.safe_load(COMPOSE.read_text())["services"]
        data = yaml.safe_load(lab.read_text()) or {}
        for name, svc in (data.get("services") or {}).items():
            if isinstance(svc, dict) and "build" in svc and "build" not in ours.get(name, {}):
                del svc["build"]
        data["services"] = {n: s for n, s in (data.get("services") or {}).items() if s}
        out.write_text(yaml.safe_dump(data))
        return out

    # --- compose ----------------------------------------------------------------------

    def compose(
        self,
        *args: str,
        timeout: float = 180,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return run([*self.base, *args], timeout=timeout, check=check, env=self.env, input=input)

    def containers(self, *services: str) -> list[dict[str, Any]]:
        """`docker compose ps -a` rows (every state), of the given services or all."""
        out = self.compose("ps", "-a", "--format", "json", *services).stdout.strip()
        if not out:
            return []
        if out.startswith("["):
            rows: list[dict[str, Any]] = json.loads(out)
            return rows
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def inspect(self, container: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(run(["docker", "inspect", container]).stdout)[0]
        return data

    def psql(self, sql: str) -> list[list[str]]:
        """Rows of a query run by psql inside the postgres container (as `pgfleet`)."""
        out = self.compose(
            "exec",
            "-T",
            "postgres",
            "psql",
            "--username=pgfleet",
            "--dbname=pgfleet",
            "--no-psqlrc",
            "--quiet",
            "-v",
            "ON_ERROR_STOP=1",
            "--tuples-only",
            "--no-align",
            "--field-separator=|",
            input=sql,
        ).stdout
        return [line.split("|") for line in out.splitlines() if line.strip()]

    def statuses(self, ids: list[str]) -> dict[str, int]:
        """{status: count} of these jobs; jobs missing from the table count as 'missing'."""
        script = (
            "CREATE TEMP TABLE wanted (id uuid PRIMARY KEY);\n"
            "COPY wanted FROM STDIN;\n" + "".join(f"{i}\n" for i in ids) + "\\.\n"
            "SELECT coalesce(j.status::text, 'missing'), count(*) FROM wanted w "
            "LEFT JOIN pgfleet.jobs j USING (id) GROUP BY 1;\n"
        )
        return {status: int(n) for status, n in self.psql(script)}

    def prometheus(self, path: str, **params: str) -> Any:
        """GET Prometheus's HTTP API from inside the compose network (no port published)."""
        url = f"http://127.0.0.1:9090{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        out = self.compose("exec", "-T", "prometheus", "wget", "-qO-", url, timeout=60).stdout
        body = json.loads(out)
        if body.get("status") != "success":
            raise CommandFailed(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.prometheus("/api/v1/query", query=expr)["result"]
        return result

    def targets_up(self) -> dict[str, int]:
        """{scrape job: targets up} of Prometheus's active targets."""
        counts: dict[str, int] = {}
        for target in self.prometheus("/api/v1/targets", state="active")["activeTargets"]:
            job = target["labels"]["job"]
            counts.setdefault(job, 0)
            if target["health"] == "up":
                counts[job] += 1
        return counts

    # --- the jobs API, from the host through the published port -------------------------

    def api(
        self, method: str, path: str, body: Any = None, token: str | None = "default"
    ) -> tuple[int, dict[str, str], Any]:
        headers = {"Content-Type": "application/json"}
        if token == "default":
            token = self.token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, dict(exc.headers), json.loads(raw) if raw else None

    def get_status(self, path: str) -> int:
        """The status of a plain GET (no token, redirects not followed)."""

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *_args: Any, **_kw: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(f"http://127.0.0.1:{self.api_port}{path}", timeout=30) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code

    def post_jobs(self, jobs: list[dict[str, Any]]) -> list[str]:
        """Enqueue through the API in batches; the ids of the accepted jobs."""
        ids: list[str] = []
        for start in range(0, len(jobs), 200):
            status, _headers, body = self.api("POST", "/jobs", {"jobs": jobs[start : start + 200]})
            if status != 202:
                raise CommandFailed(f"POST /jobs answered {status}: {body}")
            ids += [job["id"] for job in body["jobs"]]
        return ids
