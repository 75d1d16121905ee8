"""Who may do what, against real ``pgfleet api`` processes and real Postgres: roles,
sessions that end, revocation on every replica, Secure cookies behind a trusted
proxy, weak secrets refused at startup, per-client backoff, and the guards of an
API without credentials (Host allow-list, JSON-only POSTs)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from yarl import URL

from pgfleet import Queue
from pgfleet.service.credentials import new_token
from tests.acceptance.api_support import ROOT, Api, Fleet, call, jobs_table, until
from tests.procs import free_port

PRODUCER = new_token()
VIEWER = new_token()
OPERATOR = new_token()
CREDENTIALS = f"ci:producer:{PRODUCER},ro-bob:viewer:{VIEWER},ops-alice:operator:{OPERATOR}"
ENV = {"PGFLEET_API_CREDENTIALS": CREDENTIALS}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def fleet(database: str, tmp_path: Any) -> AsyncIterator[Fleet]:
    f = Fleet(database, tmp_path)
    try:
        yield f
    finally:
        await f.stop_all()
        for proc in f.processes:  # shown by pytest when the test failed
            print(f"----- {proc.name} (pid {proc.pid}) -----\n{proc.output()[-6000:]}")


def browser(local_addr: str | None = None) -> aiohttp.ClientSession:
    """A client with a cookie jar (unsafe: cookies of a server addressed by IP), from
    ``local_addr`` when given (another client of the same machine: 127.0.0.2)."""
    connector = aiohttp.TCPConnector(local_addr=(local_addr, 0)) if local_addr else None
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), connector=connector)


async def login(
    http: aiohttp.ClientSession, base: str, token: str, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    async with http.get(f"{base}/ui/login", headers=headers) as resp:
        form = await resp.text()
        nonce = resp.cookies["pgfleet_console_login"].value
    csrf = re.search(r'name="login_csrf" value="([^"]+)"', form)
    assert csrf, form
    data = {"token": token, "login_csrf": csrf.group(1), "next": "/ui/jobs"}
    # The pre-login cookie by hand: behind a TLS proxy it is Secure, which a client
    # talking plain HTTP to the API (as the proxy does) would not send back.
    cookie = {"Cookie": f"pgfleet_console_login={nonce}"}
    async with http.post(
        f"{base}/ui/login", data=data, headers={**(headers or {}), **cookie}, allow_redirects=False
    ) as resp:
        await resp.read()
        return resp


async def page(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url, allow_redirects=False) as resp:
        return resp.status, await resp.text()


async def csrf_of(http: aiohttp.ClientSession, url: str) -> str:
    status, text = await page(http, url)
    assert status == 200, text
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found, text
    return found.group(1)


async def status_of(pool: asyncpg.Pool, job_id: Any) -> str:
    return str(await pool.fetchval("SELECT status::text FROM pgfleet.jobs WHERE id = $1", job_id))


async def dead_job(pool: asyncpg.Pool) -> uuid.UUID:
    queue = Queue(pool)
    job = await queue.enqueue("record", {"card_number": "4242", "note": "visible"})
    await queue.permanently_fail(job, "charge failed: card_number=4242 declined")
    return job


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``pgfleet ARGS`` in a child process, waited for off the event loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pgfleet", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def audit_line(api: Api, *parts: str) -> str:
    """The audit line of ``api`` holding every one of ``parts`` (waited for: the log is
    written by another process)."""

    async def found() -> str | None:
        for line in api.proc.output().splitlines():
            if "pgfleet.audit" in line and all(p in line for p in parts):
                return line
        return None

    return await until(found, f"an audit line with {parts}", timeout=10)


# ------------------------------------------------------------------ roles


async def test_a_producer_enqueues_and_reads_its_job_but_manages_nothing(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env=ENV)
    async with browser() as http:
        accepted = await call(
            http, "POST", f"{api.url}/jobs", json={"name": "record"}, headers=bearer(PRODUCER)
        )
        assert accepted.status == 202
        job_id = accepted.body["id"]
        got = await call(http, "GET", f"{api.url}/jobs/{job_id}", headers=bearer(PRODUCER))
        assert (got.status, got.body["status"]) == (200, "queued")
        before = await jobs_table(pool)
        for method, path in (
            ("GET", "/jobs"),
            ("POST", f"/jobs/{job_id}/cancel"),
            ("POST", f"/jobs/{job_id}/retry"),
        ):
            reply = await call(http, method, api.url + path, headers=bearer(PRODUCER))
            assert reply.status == 403, (method, path, reply.body)
            assert "producer role" in reply.body["error"]
        assert await jobs_table(pool) == before
        # Nor the console: a producer's secret does not sign in.
        refused = await login(http, api.url, PRODUCER)
        assert refused.status == 403
        assert "pgfleet_console" not in refused.cookies
        status, _ = await page(http, f"{api.url}/ui/jobs")
        assert status == 303  # still not signed in
    await audit_line(api, "refused ci (producer)", "may not operate")
    await audit_line(api, "refused ci (producer)", "console login")


async def test_a_viewer_sees_everything_but_payloads_and_changes_nothing(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env=ENV)
    job = await dead_job(pool)
    async with browser() as http:
        signed_in = await login(http, api.url, VIEWER)
        assert signed_in.status == 303
        for path in ("/ui/", "/ui/jobs", f"/ui/jobs/{job}", "/ui/workers", "/ui/crons"):
            status, text = await page(http, f"{api.url}{path}")
            assert status == 200, (path, text)
            assert "ro-bob (viewer)" in text
        status, text = await page(http, f"{api.url}/ui/jobs/{job}")
        # No buttons, no payload; the error shows with the card number masked.
        assert "Retry now" not in text and "show-payload" not in text
        assert "operator role only" in text
        assert "declined" in text and "4242" not in text
        status, text = await page(http, f"{api.url}/ui/jobs/{job}/payload")
        assert status == 403 and "4242" not in text
        # The forms are not shown; posting one anyway, with a valid CSRF token, is refused.
        csrf = await csrf_of(http, f"{api.url}/ui/jobs/{job}")
        for action in ("retry", "cancel", "fail"):
            async with http.post(
                f"{api.url}/ui/jobs/{job}/{action}", data={"csrf": csrf}, allow_redirects=False
            ) as resp:
                assert resp.status == 403, action
                assert "viewer role" in await resp.text()
        status, _ = await page(http, f"{api.url}/ui/bulk?action=retry&name=record")
        assert status == 403
        assert await status_of(pool, job) == "failed"
        listed = await call(http, "GET", f"{api.url}/jobs?status=failed", headers=bearer(VIEWER))
        assert listed.status == 200
        assert [j["id"] for j in listed.body["jobs"]] == [str(job)]
        assert "4242" not in listed.body["jobs"][0]["error"]
        retried = await call(http, "POST", f"{api.url}/jobs/{job}/retry", headers=bearer(VIEWER))
        assert retried.status == 403
        enqueue = await call(
            http, "POST", f"{api.url}/jobs", json={"name": "record"}, headers=bearer(VIEWER)
        )
        assert enqueue.status == 403
    assert await status_of(pool, job) == "failed"
    await audit_line(api, "ro-bob (viewer) from 127.0.0.1: console login")
    await audit_line(api, "refused ro-bob (viewer)", "may not operate", f"/ui/jobs/{job}/retry")


async def test_an_operator_acts_and_every_audit_line_names_them(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env=ENV)
    job = await dead_job(pool)
    other = await dead_job(pool)
    async with browser() as http:
        assert (await login(http, api.url, "wrong-" + OPERATOR)).status == 401
        assert (await login(http, api.url, OPERATOR)).status == 303
        status, text = await page(http, f"{api.url}/ui/jobs/{job}/payload")
        assert status == 200 and "visible" in text
        assert "4242" not in text, "card_number is redacted by default"
        csrf = await csrf_of(http, f"{api.url}/ui/jobs/{job}")
        async with http.post(
            f"{api.url}/ui/jobs/{job}/retry", data={"csrf": csrf}, allow_redirects=False
        ) as resp:
            assert resp.status == 303
        assert await status_of(pool, job) == "queued"
        cancelled = await call(
            http, "POST", f"{api.url}/jobs/{other}/retry", headers=bearer(OPERATOR)
        )
        assert cancelled.status == 200
    assert await status_of(pool, other) == "queued"
    await audit_line(api, "failed console login from 127.0.0.1")
    await audit_line(api, "ops-alice (operator) from 127.0.0.1: console login")
    await audit_line(api, "ops-alice (operator) from 127.0.0.1: console: retry job", str(job))
    await audit_line(api, "ops-alice (operator) from 127.0.0.1: retry job", str(other))
    assert OPERATOR not in api.proc.output(), "secrets are never logged"
    # The access log names who made each request, console pages included.
    assert f"127.0.0.1 ops-alice GET /ui/jobs/{job}/payload 200" in api.proc.output()
    assert f"127.0.0.1 ops-alice POST /jobs/{other}/retry 200" in api.proc.output()


async def test_the_bulk_notice_says_what_the_server_did_never_what_a_link_says(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env=ENV)
    await dead_job(pool)
    async with browser() as http:
        assert (await login(http, api.url, OPERATOR)).status == 303
        forged = "/ui/?bulk=retry&name=Your+account+is+locked+call+555&n=99"
        status, text = await page(http, api.url + forged)
        assert status == 200
        assert "Your account is locked" not in text and "99" not in text
        csrf = await csrf_of(http, f"{api.url}/ui/bulk?action=retry&name=record")
        async with http.post(
            f"{api.url}/ui/bulk",
            data={"csrf": csrf, "action": "retry", "name": "record", "expected": "1"},
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/ui/"
        status, text = await page(http, f"{api.url}/ui/")
        assert "Retried 1 dead record job(s)" in text
        status, text = await page(http, f"{api.url}/ui/")
        assert "Retried" not in text, "a notice shows once"


# ------------------------------------------------------------------ sessions that end


async def test_a_logged_out_session_is_refused_at_once_on_every_replica(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    first = await fleet.api(env=ENV)
    second = await fleet.api(env=ENV)
    async with browser() as http:
        assert (await login(http, first.url, OPERATOR)).status == 303
        cookie = http.cookie_jar.filter_cookies(URL(first.url + "/ui/"))
        old = {"Cookie": f"pgfleet_console={cookie['pgfleet_console'].value}"}
        # Replicas share sessions (a load balancer may send the next request anywhere).
        async with (
            aiohttp.ClientSession() as raw,
            raw.get(f"{second.url}/ui/jobs", headers=old) as resp,
        ):
            assert resp.status == 200
        csrf = await csrf_of(http, f"{first.url}/ui/jobs")
        async with http.post(
            f"{first.url}/ui/logout", data={"csrf": csrf}, allow_redirects=False
        ) as resp:
            assert resp.status == 303
        async with aiohttp.ClientSession() as raw:
            for api in (first, second):
                async with raw.get(f"{api.url}/ui/jobs", headers=old, allow_redirects=False) as r:
                    assert r.status == 401, api.url
                    assert "session has ended" in await r.text()
    await audit_line(first, "ops-alice (operator) from 127.0.0.1: console logout")


async def test_a_session_ends_after_its_idle_timeout(fleet: Fleet, pool: asyncpg.Pool) -> None:
    api = await fleet.api("--ui-session-idle", "60", env=ENV)
    async with browser() as http:
        assert (await login(http, api.url, VIEWER)).status == 303
        assert (await page(http, f"{api.url}/ui/jobs"))[0] == 200
        # Idle for over a minute, as far as the database clock can tell.
        await pool.execute(
            "UPDATE pgfleet.console_sessions SET last_seen_at = now() - interval '61 seconds'"
        )
        assert (await page(http, f"{api.url}/ui/jobs"))[0] == 401
    async with browser() as http:
        assert (await login(http, api.url, VIEWER)).status == 303
        await pool.execute(
            "UPDATE pgfleet.console_sessions SET expires_at = now() - interval '1 second'"
        )
        assert (await page(http, f"{api.url}/ui/jobs"))[0] == 401


async def test_a_revoked_credential_is_refused_at_once_on_every_replica(
    fleet: Fleet, pool: asyncpg.Pool, database: str
) -> None:
    first = await fleet.api(env=ENV)
    second = await fleet.api(env=ENV)
    async with browser() as http:
        assert (await login(http, second.url, OPERATOR)).status == 303
        assert (await page(http, f"{second.url}/ui/jobs"))[0] == 200
        for api in (first, second):
            got = await call(http, "GET", f"{api.url}/jobs", headers=bearer(OPERATOR))
            assert got.status == 200
        revoke = await cli(
            "credentials", "revoke", "ops-alice", "--dsn", database, "--reason", "laptop lost"
        )
        assert revoke.returncode == 0, revoke.stderr
        assert "ops-alice revoked; 1 console session(s) ended" in revoke.stdout
        for api in (first, second):
            refused = await call(http, "GET", f"{api.url}/jobs", headers=bearer(OPERATOR))
            assert refused.status == 401, api.url
        assert (await page(http, f"{second.url}/ui/jobs"))[0] == 401
        # The others keep working; and the name is refused for a new secret too.
        assert (await call(http, "GET", f"{first.url}/jobs", headers=bearer(VIEWER))).status == 200
        assert (await login(http, first.url, OPERATOR)).status == 401
    listed = await cli("credentials", "list", "--dsn", database)
    assert "ops-alice" in listed.stdout and "laptop lost" in listed.stdout
    await audit_line(first, "refused revoked credential ops-alice")
    restore = await cli("credentials", "restore", "ops-alice", "--dsn", database)
    assert restore.returncode == 0, restore.stderr
    async with aiohttp.ClientSession() as http:

        async def accepted() -> bool:
            reply = await call(http, "GET", f"{first.url}/jobs", headers=bearer(OPERATOR))
            return reply.status == 200

        await until(accepted, "the restored credential to be accepted", timeout=10)


# ------------------------------------------------------------------ behind a proxy


async def test_cookies_are_secure_through_a_trusted_proxy_and_not_through_another(
    fleet: Fleet,
) -> None:
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.50"}
    trusting = await fleet.api("--trusted-proxies", "127.0.0.0/8", env=ENV)
    untrusting = await fleet.api("--trusted-proxies", "10.0.0.0/8", env=ENV)
    always = await fleet.api("--ui-secure-cookies", env=ENV)

    async def session_cookie(api: Api, headers: dict[str, str]) -> str:
        async with browser() as http:
            resp = await login(http, api.url, VIEWER, headers=headers)
            assert resp.status == 303
            return next(c for c in resp.headers.getall("Set-Cookie") if "pgfleet_console=" in c)

    secure = await session_cookie(trusting, forwarded)
    assert "Secure" in secure and "HttpOnly" in secure and "SameSite=Strict" in secure
    assert "Secure" not in await session_cookie(untrusting, forwarded)
    assert "Secure" not in await session_cookie(trusting, {})
    assert "Secure" in await session_cookie(always, {})
    # The client's address came from the trusted proxy's header; not from another one.
    await audit_line(trusting, "ro-bob (viewer) from 203.0.113.50: console login")
    await audit_line(untrusting, "ro-bob (viewer) from 127.0.0.1: console login")


# ------------------------------------------------------------------ guessing


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PGFLEET_API_TOKEN": "x"}, "fewer than 24"),
        ({"PGFLEET_API_TOKEN": "change-me-api-token"}, "contains 'change-me'"),
        ({"PGFLEET_API_CREDENTIALS": "ci:producer:aaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, "distinct"),
        ({"PGFLEET_API_CREDENTIALS": f"ci:root:{PRODUCER}"}, "unknown role 'root'"),
        ({"PGFLEET_API_CREDENTIALS": f"a:viewer:{VIEWER},b:operator:{VIEWER}"}, "same secret"),
    ],
)
async def test_weak_secrets_and_placeholders_are_refused_at_startup(
    fleet: Fleet, env: dict[str, str], message: str
) -> None:
    port = str(free_port())
    proc = fleet.spawn("api", "api", "--dsn", fleet.database, "--port", port, env=env)
    assert await proc.wait() != 0
    assert message in proc.output()
    for secret in (PRODUCER, VIEWER):
        assert secret not in proc.output()


async def test_repeated_failures_slow_down_that_client_only(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api("--auth-free-failures", "3", env=ENV)
    wrong = bearer("wrong-" + PRODUCER)
    async with browser() as attacker, browser("127.0.0.2") as neighbour:
        # 20 guesses at once: the first three are checked and refused, then the client
        # is paused and every further attempt is answered 429 unchecked.
        replies = await asyncio.gather(
            *(call(attacker, "POST", f"{api.url}/jobs", json={"name": "x"}, headers=wrong)
              for _ in range(20))
        )  # fmt: skip
        statuses = sorted(r.status for r in replies)
        assert statuses.count(401) == 4, statuses  # three free failures and the one pausing
        assert statuses.count(429) == 16, statuses
        paused = next(r for r in replies if r.status == 429)
        assert int(paused.headers["Retry-After"]) >= 1
        # While paused even the right token is not checked: guessing cannot go faster.
        right = await call(attacker, "GET", f"{api.url}/jobs", headers=bearer(VIEWER))
        assert right.status == 429
        # The login form of the same client is paused too.
        assert (await login(attacker, api.url, VIEWER)).status == 429
        # Another client is not slowed.
        ok = await call(neighbour, "GET", f"{api.url}/jobs", headers=bearer(VIEWER))
        assert ok.status == 200
        for _ in range(4):  # three free failures, and the one that starts a pause
            assert (await login(neighbour, api.url, "nope-" + VIEWER)).status == 401
        assert (await login(neighbour, api.url, VIEWER)).status == 429
    assert await jobs_table(pool) == []
    await audit_line(api, "failed bearer authentication from 127.0.0.1", "paused")


# ------------------------------------------------------------------ without credentials


async def test_without_credentials_other_hosts_and_cross_site_forms_are_refused(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    job = await Queue(pool).enqueue("record", {})
    before = await jobs_table(pool)
    async with aiohttp.ClientSession() as http:
        # DNS rebinding: the browser believes it talks to evil.example.
        rebound = {"Host": "evil.example:8000"}
        for method, path in (("POST", "/jobs"), ("GET", "/jobs"), ("POST", f"/jobs/{job}/cancel")):
            body = {"name": "record"} if path == "/jobs" and method == "POST" else {}
            reply = await call(http, method, api.url + path, json=body, headers=rebound)
            assert reply.status == 421, (method, path, reply.body)
            assert "allowed-hosts" in reply.body["error"]
        # Probes stay open whatever the Host (a kubelet sends the pod's address).
        assert (await call(http, "GET", f"{api.url}/healthz", headers=rebound)).status == 200
        # A page of another site can post a form (no preflight), never JSON.
        for content_type, data in (
            ("application/x-www-form-urlencoded", "name=record"),
            ("text/plain", '{"name": "record"}'),
            ("multipart/form-data; boundary=x", "--x--"),
            (None, None),
        ):
            headers = {"Content-Type": content_type} if content_type else {}
            for path in ("/jobs", f"/jobs/{job}/cancel"):
                reply = await call(http, "POST", api.url + path, data=data, headers=headers)
                assert reply.status == 415, (content_type, path, reply.body)
        assert await jobs_table(pool) == before
        # The same requests as JSON, with this API's Host, go through.
        assert (await call(http, "POST", f"{api.url}/jobs/{job}/cancel", json={})).status == 200
        reply = await call(http, "POST", f"{api.url}/jobs", json={"name": "record"})
        assert reply.status == 202


async def test_the_public_readyz_says_not_ready_and_keeps_why_to_the_metrics_port(
    fleet: Fleet,
) -> None:
    dsn = f"postgresql://nobody:pw@127.0.0.1:{free_port()}/nowhere"
    api = await fleet.api(dsn=dsn, metrics=True)
    async with aiohttp.ClientSession() as http:
        public = await call(http, "GET", f"{api.url}/readyz")
        assert public.status == 503 and public.body == {"status": "not ready"}
        private = await call(http, "GET", f"{api.metrics_url}/readyz")
        assert private.status == 503 and "refused" in private.body["reason"].lower()
    assert "not ready" in api.proc.output()
