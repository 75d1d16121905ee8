"""worker/Dockerfile (its facts read from the text; tests/compose/ builds it for real
when an engine answers) and the health check script the image runs."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.support import DOCKERFILE, ROOT
from tests.procs import free_port

HEALTHCHECK = ROOT / "worker" / "healthcheck.py"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions per stage name, in order (the last one is the default target)."""
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for word, rest in instructions():
        if word == "FROM":
            match = re.fullmatch(r"(\S+) AS (\S+)", rest, re.IGNORECASE)
            assert match, f"every stage is named: FROM {rest}"
            current = result[match.group(2)] = [("FROM", match.group(1))]
        elif current is not None:
            current.append((word, rest))
    return result


def final_stage_chain() -> list[list[tuple[str, str]]]:
    """The default target and the stages it is built FROM, default target first."""
    all_stages = stages()
    chain = [all_stages[list(all_stages)[-1]]]
    while chain[-1][0][1] in all_stages:
        chain.append(all_stages[chain[-1][0][1]])
    return chain


def test_base_image_is_a_pinned_slim_python() -> None:
    args = dict(
        rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest
    )
    base = args["PYTHON_IMAGE"]
    # A tag for people, its digest for the builder: the same bytes on every rebuild.
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-(bookworm|trixie)@sha256:[0-9a-f]{64}", base), (
        base
    )
    for _stage, body in stages().items():
        image = body[0][1]
        assert image == "${PYTHON_IMAGE}" or image in stages(), image


def test_multi_stage_with_dependencies_installed_apart_from_the_final_image() -> None:
    all_stages = stages()
    assert list(all_stages)[-1] == "runtime", "the default target runs pgfleet"
    deps = " ".join(rest for _w, rest in all_stages["deps"])
    # Dependencies from the lock alone, before the code is copied: a code change reuses
    # that layer. Every file is checked against its hash; nothing is resolved.
    assert ("COPY", "requirements/service.lock requirements/") in all_stages["deps"]
    assert "--require-hashes --no-deps --requirement requirements/service.lock" in deps
    assert "COPY pgfleet" not in deps and "README" not in deps
    # pgfleet's own wheel is built with the locked setuptools, nothing fetched unpinned.
    wheel = " ".join(rest for _w, rest in all_stages["wheel"])
    assert "--require-hashes --no-deps --requirement requirements/build.lock" in wheel
    assert "pip wheel --no-deps --no-build-isolation" in wheel
    builder = all_stages["builder"]
    assert builder[0] == ("FROM", "deps")
    runs = [" ".join(rest.split()) for word, rest in builder if word == "RUN"]
    assert runs == ["/opt/venv/bin/pip install --no-deps /wheels/*.whl && /opt/venv/bin/pip check"]
    loadtest = " ".join(rest for _w, rest in all_stages["loadtest-deps"])
    assert "--require-hashes --no-deps --requirement requirements/loadtest.lock" in loadtest
    # No pip install in any stage takes a requirement without its lock.
    for name, body in all_stages.items():
        for word, rest in body:
            if word == "RUN" and "pip install" in rest:
                for command in rest.split("&&"):
                    if "pip install" in command and "/wheels/" not in command:
                        assert "--require-hashes" in command, f"{name}: {command}"
    # Every dependency is a binary wheel: no compiler in any stage, and pip refuses to
    # fall back to compiling an sdist (which would fail for want of one anyway).
    assert "PIP_ONLY_BINARY=:all:" in deps
    for name, body in all_stages.items():
        for word, rest in body:
            assert not (word == "RUN" and "apt-get" in rest), f"{name}: {rest}"
    for body in final_stage_chain():
        for word, rest in body:
            assert not (word == "RUN" and "apt-get install" in rest), (
                f"no build tools in the final image: {rest}"
            )
    runtime = all_stages["runtime"]
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in runtime


def test_final_image_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in final_stage_chain()[0] if word == "USER"]
    assert users, "USER is set in the runtime stage"
    assert users[-1].split(":")[0] not in ("0", "root")


def test_healthcheck_hits_healthz_with_python_and_worker_is_the_default_command() -> None:
    runtime = dict(final_stage_chain()[0])
    assert "/app/worker/healthcheck.py" in runtime["HEALTHCHECK"]
    # No port in the instruction: the script finds the one of the command being run.
    assert runtime["HEALTHCHECK"].rstrip().endswith('"/app/worker/healthcheck.py"]')
    assert '"python"' in runtime["HEALTHCHECK"], "slim images have no curl"
    assert runtime["CMD"] == '["pgfleet", "worker"]', "exec form, so SIGTERM reaches pgfleet"
    assert ("COPY", "worker ./worker") in final_stage_chain()[0]
    assert ("WORKDIR", "/app") in final_stage_chain()[-1]


def test_tzdata_comes_from_the_python_package() -> None:
    assert "tzdata" in DOCKERFILE.read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\s*"tzdata', pyproject, re.MULTILINE), "tzdata is a dependency"


def test_dockerignore_allows_only_what_the_image_needs() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list: .env, .git and .venv never reach the context"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "requirements/*.lock", "README.md", "pgfleet", "worker"}


# --- the health check script ---------------------------------------------------------


@pytest.fixture
def health_server() -> Iterator[tuple[int, dict[str, Any]]]:
    state: dict[str, Any] = {"status": 200, "paths": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["paths"].append(self.path)
            body = b'{"status": "ok"}'
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def healthcheck(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or {},
    )


def test_healthcheck_passes_when_healthz_answers(health_server: tuple[int, Any]) -> None:
    port, state = health_server
    result = healthcheck(str(port))
    assert result.returncode == 0, result.stderr
    assert state["paths"] == ["/healthz"]


def test_healthcheck_reads_the_port_from_the_environment(health_server: tuple[int, Any]) -> None:
    port, _state = health_server
    assert healthcheck(env={"PGFLEET_METRICS_PORT": str(port)}).returncode == 0
    assert (
        healthcheck(env={"PGFLEET_HEALTH_PORT": str(port), "PGFLEET_METRICS_PORT": "1"}).returncode
        == 0
    )


def test_healthcheck_fails_on_an_error_status(health_server: tuple[int, Any]) -> None:
    port, state = health_server
    state["status"] = 503
    result = healthcheck(str(port))
    assert result.returncode == 1
    assert "503" in result.stderr


def test_healthcheck_fails_when_nothing_listens() -> None:
    result = healthcheck(str(free_port()))
    assert result.returncode == 1
    assert "healthz" in result.stderr


# The same image runs `pgfleet worker` (health on 9464) and `pgfleet api` (9465): the
# port comes from the command the container runs, /proc/1/cmdline, past an init.
IMAGE_ENV = {"PGFLEET_METRICS_PORT": "9464", "PGFLEET_METRICS_HOST": "0.0.0.0"}


@pytest.mark.parametrize(
    ("cmdline", "environ", "port"),
    [
        (["pgfleet", "api"], IMAGE_ENV, 9465),
        (["/sbin/docker-init", "--", "pgfleet", "api"], IMAGE_ENV, 9465),
        (["/opt/venv/bin/python", "/opt/venv/bin/pgfleet", "api"], IMAGE_ENV, 9465),
        (["python", "-m", "pgfleet", "api", "--log-level", "debug"], IMAGE_ENV, 9465),
        (["pgfleet", "api"], {**IMAGE_ENV, "PGFLEET_API_METRICS_PORT": "9600"}, 9600),
        (["pgfleet", "api", "--metrics-port", "9700"], IMAGE_ENV, 9700),
        (["pgfleet", "api", "--metrics-port=9701"], IMAGE_ENV, 9701),
        # Metrics off: the API's own /healthz.
        (["pgfleet", "api", "--metrics-port", "0"], IMAGE_ENV, 8000),
        (["pgfleet", "api", "--metrics-port", "0", "--port", "8080"], IMAGE_ENV, 8080),
        (["/sbin/docker-init", "--", "pgfleet", "worker"], IMAGE_ENV, 9464),
        (["pgfleet", "worker"], {"PGFLEET_METRICS_PORT": "9500"}, 9500),
        (["pgfleet", "worker", "--metrics-port", "9501"], IMAGE_ENV, 9501),
        (["pgfleet", "worker"], {}, 9464),
        # Anything else (or an unreadable /proc): PGFLEET_METRICS_PORT, else 9464.
        (["pgfleet", "migrate"], {"PGFLEET_METRICS_PORT": "9502"}, 9502),
        ([], {}, 9464),
        (["sleep", "infinity"], IMAGE_ENV, 9464),
    ],
)
def test_healthcheck_port_follows_the_command_the_container_runs(
    cmdline: list[str], environ: dict[str, str], port: int
) -> None:
    from worker.healthcheck import port_from

    assert port_from(["healthcheck.py"], environ, cmdline) == port


def test_healthcheck_port_argument_and_health_port_win_over_the_command() -> None:
    from worker.healthcheck import port_from

    api = ["pgfleet", "api"]
    assert port_from(["healthcheck.py", "9999"], IMAGE_ENV, api) == 9999
    assert port_from(["healthcheck.py"], {**IMAGE_ENV, "PGFLEET_HEALTH_PORT": "9998"}, api) == 9998


def test_healthcheck_reads_the_command_line_of_pid_1(tmp_path: Path) -> None:
    from worker.healthcheck import read_cmdline

    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/sbin/docker-init\0--\0pgfleet\0api\0")
    assert read_cmdline(cmdline) == ["/sbin/docker-init", "--", "pgfleet", "api"]
    assert read_cmdline(tmp_path / "missing") == []


def test_healthcheck_refuses_a_bad_port() -> None:
    result = healthcheck("not-a-port")
    assert result.returncode == 1
    assert "bad port" in result.stderr
