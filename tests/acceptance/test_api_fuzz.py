"""Schemathesis against real ``pgfleet api`` processes and real Postgres, from the
OpenAPI document each serves: every operation with generated requests (stateless),
and sequences that follow the document's links (stateful: enqueue, then read,
cancel and retry what was enqueued), with and without credentials.

What must hold for every request: no 5xx, no status, header, content type or body
outside the document, and a refused request (4xx) writes nothing (the jobs, the
revocations and the sessions are compared before and after it).

The default profile is short (it runs in ``.ci/run``); ``make api-fuzz`` runs the
long one (``PGFLEET_API_FUZZ_PROFILE=long``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from pgfleet.service.credentials import new_token
from tests import pgharness
from tests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
PROFILE = os.environ.get("PGFLEET_API_FUZZ_PROFILE", "short")
#: (examples per operation and caller, stateful runs, steps per run)
SIZES = {"short": (12, 6, 8), "long": (300, 100, 25)}[PROFILE]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
PRODUCER, VIEWER, OPERATOR = new_token(), new_token(), new_token()
CREDENTIALS = f"ci:producer:{PRODUCER},ro:viewer:{VIEWER},ops:operator:{OPERATOR}"
CALLERS = {
    "operator": OPERATOR,
    "viewer": VIEWER,
    "producer": PRODUCER,
    "wrong": "wrong-" + OPERATOR,
    "none": None,
}
JOBS_OPERATIONS = {
    "POST /jobs",
    "GET /jobs",
    "GET /jobs/{id}",
    "POST /jobs/{id}/cancel",
    "POST /jobs/{id}/retry",
}
#: No shrinking: the API's answers depend on what earlier requests wrote, so a
#: shrunk case would not fail the same way; the first failing case is reported.
PHASES = (Phase.explicit, Phase.generate)
FUZZ_SETTINGS = settings(
    phases=PHASES,
    max_examples=SIZES[0],
    deadline=None,
    derandomize=PROFILE == "short",
    suppress_health_check=list(HealthCheck),
    database=None,
)


@dataclass
class RunningApi:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_api(tmp: Path, dsn: str, name: str, env: dict[str, str]) -> RunningApi:
    for _attempt in range(3):  # a free port can be taken before the child binds it
        port = free_port()
        log = tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgfleet", "api", "--dsn", dsn, "--port", str(port),
                 "--metrics-port", "0", "--max-batch", "20",
                 # No worker runs: a long poll would only wait out its time.
                 "--max-wait", "0",
                 # 401s are what this exercises: the backoff (429) is test_access's.
                 "--auth-free-failures", "1000"],
                cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return RunningApi(url, proc, log)
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
        if "cannot listen" not in log.read_text(errors="replace"):
            break
    raise AssertionError(f"pgfleet api did not start:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def fuzz_database(pg_server: pgharness.Server) -> Iterator[str]:
    name = asyncio.run(pgharness.create_database(pg_server))
    try:
        yield pg_server.dsn_for(name)
    finally:
        asyncio.run(pgharness.drop_database(pg_server, name))


@pytest.fixture(scope="module")
def apis(
    fuzz_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RunningApi]]:
    tmp = tmp_path_factory.mktemp("api-fuzz")
    started = {
        "open": start_api(tmp, fuzz_database, "open", {}),
        "auth": start_api(tmp, fuzz_database, "auth", {"PGFLEET_API_CREDENTIALS": CREDENTIALS}),
    }
    try:
        yield started
    finally:
        for api in started.values():
            api.proc.terminate()
            try:
                api.proc.wait(30)
            except subprocess.TimeoutExpired:
                api.proc.kill()
                api.proc.wait()
        for name, api in started.items():  # shown by pytest when a test failed
            print(f"----- api {name} -----\n{api.log.read_text(errors='replace')[-4000:]}")


@pytest.fixture(scope="module")
def open_schema(apis: dict[str, RunningApi]) -> Any:
    return schemathesis.openapi.from_url(f"{apis['open'].url}/openapi.json")


@pytest.fixture(scope="module")
def auth_schema(apis: dict[str, RunningApi]) -> Any:
    return schemathesis.openapi.from_url(f"{apis['auth'].url}/openapi.json")


@pytest.fixture(scope="module")
def written(fuzz_database: str) -> Iterator[Callable[[], tuple[Any, ...]]]:
    """What a request could have written: a digest of every job's row, the revoked
    credentials and the console sessions."""
    with psycopg.connect(fuzz_database, autocommit=True) as conn:

        def state() -> tuple[Any, ...]:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM pgfleet.jobs),"
                " (SELECT coalesce(md5(string_agg(j::text, ',' ORDER BY j.id)), '')"
                "    FROM pgfleet.jobs j),"
                " (SELECT count(*) FROM pgfleet.revoked_credentials),"
                " (SELECT count(*) FROM pgfleet.console_sessions)"
            ).fetchone()
            assert row is not None
            return tuple(row)

        yield state


#: The first violations seen, in order: the API's answers depend on what earlier
#: requests wrote, so Hypothesis's replay of a failing case may draw differently
#: (FlakyStrategyDefinition) and hide it; these are reported instead.
FIRST_FAILURES: list[str] = []


def call_checked(case: Any, headers: dict[str, str], written: Callable[[], tuple[Any, ...]]) -> Any:
    before = written()
    try:
        response = case.call_and_validate(headers=headers, checks=CHECKS)
        if 400 <= response.status_code < 500:
            assert written() == before, (
                f"{case.method} {case.formatted_path} was refused with "
                f"{response.status_code} but wrote: {response.text[:300]}"
            )
    except Exception as exc:
        FIRST_FAILURES.append(f"{case.operation.label}: {exc}")
        raise
    return response


def reported(run: Callable[[], Any]) -> None:
    """``run()``, failing with the first violation it saw, however Hypothesis ends."""
    FIRST_FAILURES.clear()
    try:
        run()
    except Exception:
        if FIRST_FAILURES:
            pytest.fail("\n".join(FIRST_FAILURES[:3]), pytrace=False)
        raise


def auth_headers(caller: str) -> dict[str, str]:
    token = CALLERS[caller]
    return {"Authorization": f"Bearer {token}"} if token else {}


# ------------------------------------------------------------------ stateless


def fuzz(schema: Any, check: Callable[[Any], None]) -> list[str]:
    """Run ``check`` on generated cases of every operation: valid requests, and
    requests the document says are invalid. Returns the operations that ran."""
    ran: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @FUZZ_SETTINGS
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                check(case)

            try:
                reported(run)
            except Unsatisfiable:
                # Nothing to make invalid (no parameters, no body): positive only.
                assert mode is GenerationMode.NEGATIVE, operation.label
        ran.append(operation.label)
    return ran


def test_without_credentials_every_answer_is_documented_and_refusals_write_nothing(
    open_schema: Any, written: Callable[[], tuple[Any, ...]]
) -> None:
    ran = fuzz(open_schema, lambda case: call_checked(case, {}, written))
    assert set(ran) >= JOBS_OPERATIONS, ran


def test_with_credentials_every_answer_is_documented_and_refusals_write_nothing(
    auth_schema: Any, written: Callable[[], tuple[Any, ...]]
) -> None:
    """Each generated request from every caller: no secret, a wrong one, and each role
    (refused ones first, so the operator's change comes last)."""

    def check(case: Any) -> None:
        raw = case.operation.definition.raw
        roles, public = raw.get("x-pgfleet-roles", []), raw.get("x-pgfleet-access") == "public"
        for caller in ("none", "wrong", "producer", "viewer", "operator"):
            response = call_checked(case, auth_headers(caller), written)
            sent = response.request.headers.get("Authorization")
            if public or sent != auth_headers(caller).get("Authorization"):
                # A negative case may test the API without its security scheme: it
                # sends no Authorization header, or a broken one, whoever calls.
                continue
            if response.status_code in (404, 405):
                continue
            if caller in ("none", "wrong"):
                assert response.status_code == 401, (caller, response.status_code)
            elif caller not in roles:
                assert response.status_code == 403, (
                    caller,
                    response.status_code,
                    case.operation.label,
                )

    assert set(fuzz(auth_schema, check)) >= JOBS_OPERATIONS


# ------------------------------------------------------------------ stateful


def run_machine(
    schema: Any, headers: dict[str, str], written: Callable[[], tuple[Any, ...]]
) -> None:
    base = schema.as_state_machine()

    class Machine(base):  # type: ignore[misc, valid-type]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": headers}

        def call(self, case: Any, **kwargs: Any) -> Any:
            before = written()
            response = super().call(case, **kwargs)
            if 400 <= response.status_code < 500 and written() != before:
                message = (
                    f"{case.operation.label} was refused with {response.status_code} but "
                    f"wrote: {response.text[:300]}"
                )
                FIRST_FAILURES.append(message)
                raise AssertionError(message)
            return response

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            try:
                case.validate_response(response, checks=CHECKS)
            except Exception as exc:
                FIRST_FAILURES.append(f"{case.operation.label}: {exc}")
                raise

    reported(
        lambda: Machine.run(
            settings=settings(
                phases=PHASES,
                max_examples=SIZES[1],
                stateful_step_count=SIZES[2],
                deadline=None,
                derandomize=PROFILE == "short",
                suppress_health_check=list(HealthCheck),
                database=None,
            )
        )
    )


def test_stateful_sequences_without_credentials(
    open_schema: Any, written: Callable[[], tuple[Any, ...]]
) -> None:
    run_machine(open_schema, {}, written)


@pytest.mark.parametrize("caller", ["operator", "producer"])
def test_stateful_sequences_with_credentials(
    auth_schema: Any, caller: str, written: Callable[[], tuple[Any, ...]]
) -> None:
    run_machine(auth_schema, auth_headers(caller), written)
