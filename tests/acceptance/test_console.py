"""The operator console (/ui of ``pgfleet api``) in a real Chromium, against real
``pgfleet api`` and ``pgfleet worker`` processes and real Postgres.

The browser is Debian's ``chromium`` driven by Playwright (never a downloaded
browser build). Screenshots of every page go to ``$PGFLEET_UI_SCREENSHOTS`` when it
is set (``make screenshots`` writes docs/console/), else to the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NoReturn
from uuid import UUID

import aiohttp
import asyncpg
import pytest

from pgfleet import EnqueueOptions, Queue
from tests.acceptance.api_support import Fleet, until
from tests.apps.console_app import REFUSAL
from tests.helpers import put_in_state

TOKEN = "console-test-token-3f9a-7Kq2wZ"
APP = "tests.apps.console_app:registry"
CRONS = "tests.apps.console_app:crons"
SCRIPT_PAYLOAD = {"card": "4242", "note": "<script>window.__pwned = 'payload'</script>"}


def chromium_path() -> str | None:
    for candidate in (os.environ.get("PGFLEET_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@pytest.fixture
async def fleet(database: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(database, tmp_path)
    try:
        yield f
    finally:
        await f.stop_all()
        for proc in f.processes:  # shown by pytest when the test failed
            print(f"----- {proc.name} (pid {proc.pid}) -----\n{proc.output()[-5000:]}")


def unavailable(why: str) -> NoReturn:
    """Skip saying why; in CI (which installs both) fail instead: these tests must run."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must run the browser tests)")
    pytest.skip(why)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unavailable("playwright is not installed: pip install -e '.[dev]'")
    executable = chromium_path()
    if executable is None:
        unavailable("needs Debian's chromium (apt-get install chromium; .ci/run installs it)")
    async with async_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start.
        b = await p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("PGFLEET_UI_SCREENSHOTS") or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def shot(page: Any, shots: Path, name: str) -> None:
    await page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


async def new_page(browser: Any) -> tuple[Any, list[str]]:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    return page, problems


async def dead_count(pool: asyncpg.Pool, kind: str) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM pgfleet.jobs WHERE status = 'failed' AND name = $1", kind
        )
    )


async def status(pool: asyncpg.Pool, job_id: UUID) -> str:
    return str(await pool.fetchval("SELECT status::text FROM pgfleet.jobs WHERE id = $1", job_id))


async def test_operator_finds_a_dead_job_retries_it_and_watches_it_succeed(
    fleet: Fleet, pool: asyncpg.Pool, browser: Any, shots: Path
) -> None:
    api = await fleet.api(env={"PGFLEET_API_TOKEN": TOKEN}, metrics=True)
    worker = fleet.spawn(
        "worker",
        "worker",
        "--dsn",
        fleet.database,
        "--app",
        APP,
        "--crons",
        CRONS,
        "--metrics-port",
        "0",
        "--poll-interval",
        "0.2",
    )
    queue = Queue(pool)
    once = EnqueueOptions(max_attempts=1)
    target = await queue.enqueue("charge_card", SCRIPT_PAYLOAD, options=once)
    others = [await queue.enqueue("charge_card", {"card": str(n)}, options=once) for n in range(4)]
    for n in range(6):
        await queue.enqueue("send_email", {"to": f"user{n}@example.com"})
    dead = 1 + len(others)

    async def all_dead() -> bool:
        assert worker.alive, worker.output()
        return await dead_count(pool, "charge_card") == dead

    await until(all_dead, "the charge_card jobs to go dead")

    page, problems = await new_page(browser)
    # Not signed in: every page sends the browser to the login form.
    await page.goto(f"{api.url}/ui/jobs")
    assert "/ui/login" in page.url
    await shot(page, shots, "login")
    await page.fill("#token", TOKEN)
    await page.click("form.login button[type=submit]")
    await page.wait_for_url(re.compile(r"/ui/jobs$"))

    # The overview: per kind, the dead count and the bulk links; the fleet's roles.
    async with aiohttp.ClientSession() as http, http.get(f"{api.metrics_url}/metrics") as resp:
        assert resp.status == 200  # a scrape: the api takes the metrics lease
    await page.goto(f"{api.url}/ui/")
    metrics_role = page.locator("tr", has_text="metrics")
    assert "this api process" in await metrics_role.inner_text()
    leader_role = page.locator("tr", has_text="leader")
    assert f":{worker.pid}" in await leader_role.inner_text()
    row = page.locator("tr", has_text="charge_card")
    assert (await row.locator("td").nth(4).inner_text()).strip() == str(dead)
    assert await page.locator("#refresh-toggle").is_visible()  # console.js ran
    await shot(page, shots, "overview")

    # Find the dead job by filter.
    await page.click("nav a:text('Jobs')")
    await page.select_option("#f-status", "failed")
    await page.fill("#f-name", "charge_card")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(re.compile(r"status=failed"))
    assert await page.locator("tbody tr").count() == dead
    await shot(page, shots, "jobs")
    await page.click(f"a[href='/ui/jobs/{target}']")
    await page.wait_for_url(re.compile(str(target)))
    assert await page.locator(".badge.failed").first.inner_text() == "dead"
    # The error and the payload hold <script>: both render as text, neither runs.
    assert await page.locator("pre.error-text").first.inner_text() == f"PermanentError: {REFUSAL}"
    assert await page.locator("#payload").count() == 0  # behind a click
    await page.click("#show-payload")
    assert (
        "<script>window.__pwned = 'payload'</script>" in await page.locator("#payload").inner_text()
    )
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("script").count() == 1  # only /ui/static/console.js
    await shot(page, shots, "job-dead")

    # Retry it once the processor is fixed, and watch it succeed on the worker.
    await pool.execute("INSERT INTO public.console_fixes VALUES ('charge_card')")
    await page.click("button:text('Retry now')")
    await page.wait_for_selector("p.notice:has-text('Retried')")
    # The page refreshes itself while the job is queued or running.
    await page.wait_for_selector(".badge.succeeded", timeout=60_000)
    await shot(page, shots, "job-succeeded")
    ran_on = await pool.fetch("SELECT pid FROM public.console_runs WHERE job_id = $1", target)
    assert [r["pid"] for r in ran_on] == [worker.pid]
    assert await status(pool, target) == "succeeded"

    # Bulk retry: the confirmation states how many.
    await page.goto(f"{api.url}/ui/")
    await page.click("a[href='/ui/bulk?action=retry&name=charge_card']")
    left = await dead_count(pool, "charge_card")
    assert left == len(others)
    confirm = await page.locator("#confirm-text").inner_text()
    assert confirm == f"Retry {left} dead charge_card jobs?"
    await shot(page, shots, "bulk-confirm")
    await page.click(f"button:text('Yes, retry {left} jobs')")
    await page.wait_for_selector(f"p.notice:has-text('Retried {left} dead charge_card job(s)')")

    async def all_succeeded() -> bool:
        rows = await pool.fetch(
            "SELECT status::text FROM pgfleet.jobs WHERE id = ANY($1::uuid[])", others
        )
        return all(r["status"] == "succeeded" for r in rows)

    await until(all_succeeded, "the bulk-retried jobs to succeed on the worker")

    # Workers: force-unlock one that is registered but holds a job it will never finish.
    ghost = UUID("00000000-0000-4000-8000-00000000beef")
    await pool.execute(
        "INSERT INTO pgfleet.workers (id, hostname, pid, concurrency, job_names, version,"
        " expires_at) VALUES ($1, 'ghost-host', 4242, 4, ARRAY['send_email'], 'test',"
        " now() + interval '1 hour')",
        ghost,
    )
    held = await queue.enqueue(
        "send_email", {"to": "held@example.com"}, options=EnqueueOptions(delay=3600)
    )
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'running', attempt = 1, started_at = now(),"
        " locked_by = $2, lock_token = gen_random_uuid() WHERE id = $1",
        held,
        ghost,
    )
    await page.goto(f"{api.url}/ui/workers")
    assert await page.locator("tbody tr").count() == 2
    await shot(page, shots, "workers")
    await page.click(f"a[href='/ui/workers/{ghost}/unlock']")
    assert "ghost-host:4242" in await page.locator("#confirm-text").inner_text()
    assert "may run twice" in await page.locator("main").inner_text()  # its heartbeat is live
    await shot(page, shots, "force-unlock")
    await page.click("button:text('Yes, force-unlock')")
    await page.wait_for_selector("p.notice:has-text('1 job(s) requeued')")
    await until(lambda: _is(pool, held, "succeeded"), "the unlocked job to run on the real worker")
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.workers WHERE id = $1", ghost) == 0

    # Cron: schedules, zones, next occurrences, the job of the last occurrence.
    await page.click("nav a:text('Cron')")
    nightly = page.locator("tr", has_text="nightly-report")
    assert "Europe/Paris" in await nightly.inner_text()
    assert await nightly.locator("ul.plain li").count() == 3
    digest_job = await pool.fetchval("SELECT last_job_id FROM pgfleet.crons WHERE id = 'digest'")
    assert digest_job is not None  # catch_up_on_start enqueued one
    assert await page.locator(f"a[href='/ui/jobs/{digest_job}']").count() == 1
    await shot(page, shots, "crons")
    assert problems == []


async def _is(pool: asyncpg.Pool, job_id: UUID, wanted: str) -> bool:
    return await status(pool, job_id) == wanted


# --------------------------------------------------------------------- over plain HTTP


def session() -> aiohttp.ClientSession:
    # unsafe: keep cookies set by a server addressed by IP (127.0.0.1).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def login(
    http: aiohttp.ClientSession, base: str, token: str = TOKEN
) -> aiohttp.ClientResponse:
    async with http.get(f"{base}/ui/login") as resp:
        form = await resp.text()
    csrf = re.search(r'name="login_csrf" value="([^"]+)"', form)
    assert csrf, form
    data = {"token": token, "login_csrf": csrf.group(1), "next": "/ui/jobs"}
    async with http.post(f"{base}/ui/login", data=data, allow_redirects=False) as resp:
        await resp.read()
        return resp


async def page_csrf(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found, text
    return found.group(1)


async def test_actions_need_the_session_cookie_the_csrf_token_and_this_origin(
    fleet: Fleet, pool: asyncpg.Pool, database: str
) -> None:
    api = await fleet.api(env={"PGFLEET_API_TOKEN": TOKEN})
    queue = Queue(pool)
    job = await queue.enqueue("charge_card", {"card": "1"})
    await queue.permanently_fail(job, "broken")
    retry = f"{api.url}/ui/jobs/{job}/retry"
    bodies: list[str] = []

    async with session() as anonymous:
        async with anonymous.get(f"{api.url}/ui/jobs", allow_redirects=False) as resp:
            assert resp.status == 303
            assert resp.headers["Location"] == "/ui/login?next=%2Fui%2Fjobs"
        async with anonymous.post(retry, data={"csrf": "x"}, allow_redirects=False) as resp:
            assert resp.status == 403
            bodies.append(await resp.text())
        wrong = await login(anonymous, api.url, token="not-the-token")
        assert wrong.status == 401
        assert "pgfleet_console" not in wrong.cookies
    assert await status(pool, job) == "failed"

    async with session() as http:
        signed_in = await login(http, api.url)
        assert signed_in.status == 303 and signed_in.headers["Location"] == "/ui/jobs"
        cookie = signed_in.headers.getall("Set-Cookie")
        session_cookie = next(c for c in cookie if c.startswith("pgfleet_console="))
        assert "HttpOnly" in session_cookie and "SameSite=Strict" in session_cookie
        assert "Path=/ui" in session_cookie

        csrf = await page_csrf(http, f"{api.url}/ui/jobs/{job}")
        for data, headers in (
            ({}, {}),  # no CSRF token
            ({"csrf": csrf[:-2] + "xx"}, {}),  # a wrong one
            ({"csrf": csrf}, {"Origin": "http://evil.example"}),  # from another site
        ):
            async with http.post(retry, data=data, headers=headers, allow_redirects=False) as resp:
                assert resp.status == 403, (data, headers)
                bodies.append(await resp.text())
            assert await status(pool, job) == "failed"

        # The same request with the token goes through.
        async with http.post(retry, data={"csrf": csrf}, allow_redirects=False) as resp:
            assert resp.status == 303
            assert resp.headers["Location"] == f"/ui/jobs/{job}?done=retried"
        assert await status(pool, job) == "queued"

        # Strict CSP, no caching; never the database URL in any page.
        for path in (
            "/ui/",
            "/ui/jobs",
            f"/ui/jobs/{job}",
            "/ui/workers",
            "/ui/crons",
            f"/ui/jobs/{job}/payload",
            "/ui/bulk?action=retry&name=charge_card",
        ):
            async with http.get(f"{api.url}{path}", allow_redirects=False) as resp:
                assert resp.status == 200, path
                csp = resp.headers["Content-Security-Policy"]
                assert "script-src 'self'" in csp and "unsafe" not in csp
                assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
                assert resp.headers["Cache-Control"] == "no-store"
                bodies.append(await resp.text())
        # A login's next= never leads off the console.
        async with http.get(f"{api.url}/ui/login?next=//evil.example/x") as resp:
            assert 'name="next" value="/ui/"' in await resp.text()

    db_name = database.rsplit("/", 1)[1]
    for body in bodies:
        assert "postgresql://" not in body and db_name not in body


async def test_payload_display_off_never_renders_the_payload(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api("--ui-hide-payloads", env={"PGFLEET_API_TOKEN": TOKEN})
    job = await Queue(pool).enqueue("send_email", {"secret": "sentinel-7c1e"})
    async with session() as http:
        await login(http, api.url)
        async with http.get(f"{api.url}/ui/jobs/{job}") as resp:
            text = await resp.text()
        assert resp.status == 200
        assert "sentinel-7c1e" not in text and "show-payload" not in text
        assert "Payload display is turned off" in text
        async with http.get(f"{api.url}/ui/jobs/{job}/payload") as resp:
            assert resp.status == 403
            assert "sentinel-7c1e" not in await resp.text()


async def test_without_a_token_the_console_refuses_and_no_ui_turns_it_off(fleet: Fleet) -> None:
    open_api = await fleet.api()
    async with session() as http:
        async with http.get(f"{open_api.url}/ui/", allow_redirects=False) as resp:
            assert resp.status == 403
            assert "PGFLEET_API_TOKEN" in await resp.text()
        async with http.get(f"{open_api.url}/ui/login") as resp:
            assert resp.status == 403
    off = await fleet.api("--no-ui", env={"PGFLEET_API_TOKEN": TOKEN})
    async with session() as http:
        for path in ("/ui/", "/ui/login", "/ui/static/console.js"):
            async with http.get(f"{off.url}{path}", allow_redirects=False) as resp:
                assert resp.status == 404, path
        async with http.get(f"{off.url}/healthz") as resp:
            assert resp.status == 200


async def test_bad_input_and_refused_actions_get_a_page_naming_the_problem(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env={"PGFLEET_API_TOKEN": TOKEN})
    queue = Queue(pool)
    dead = await queue.enqueue("charge_card", {})
    await queue.permanently_fail(dead, "broken")
    async with session() as http:
        await login(http, api.url)
        for path, status, says in (
            ("/ui/jobs?status=lost", 400, "unknown status &#x27;lost&#x27;"),
            ("/ui/jobs?name=no%20spaces", 400, "invalid job name"),
            ("/ui/jobs?kind=no%20spaces", 400, "invalid job name"),  # the old parameter
            ("/ui/jobs?from=yesterday", 400, "from must be a date and time"),
            ("/ui/jobs?before=nope", 400, "before must be a UUID"),
            ("/ui/jobs/00000000-0000-7000-8000-000000000000", 404, "no job"),
            ("/ui/bulk?action=explode&name=charge_card", 400, "action must be retry or cancel"),
            (
                "/ui/workers/00000000-0000-4000-8000-000000000000/unlock",
                404,
                "No registered worker",
            ),
        ):
            async with http.get(f"{api.url}{path}") as resp:
                text = await resp.text()
                assert resp.status == status, (path, text)
                assert says in text, (path, text)
        csrf = await page_csrf(http, f"{api.url}/ui/jobs/{dead}")
        before = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", dead)
        for action, form, status, says in (
            (
                "cancel",
                dict[str, str](),
                409,
                "it is failed, and cancel applies only to queued, waiting or running jobs",
            ),
            ("reschedule", dict[str, str](), 409, "reschedule applies only to queued jobs"),
            ("fail", dict[str, str](), 409, "applies only to queued or running jobs"),
        ):
            data = {"csrf": csrf, **form}
            async with http.post(f"{api.url}/ui/jobs/{dead}/{action}", data=data) as resp:
                text = await resp.text()
                assert resp.status == status, (action, text)
                assert says in text and "nothing was changed" in text, (action, text)
        assert await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", dead) == before
        queued = await queue.enqueue("charge_card", {})
        for form, says in (
            ({"delay": "soon"}, "delay must be a number of seconds"),
            ({"delay": "-5"}, "delay must be between 0 and 100 years"),
            ({"delay": "5", "at": "2030-01-01T00:00"}, "a delay or a time, not both"),
        ):
            data = {"csrf": csrf, **form}
            async with http.post(f"{api.url}/ui/jobs/{queued}/reschedule", data=data) as resp:
                assert resp.status == 400
                assert says in await resp.text()
        data = {"csrf": csrf, "at": "2030-01-01T00:00"}
        async with http.post(f"{api.url}/ui/jobs/{queued}/reschedule", data=data) as resp:
            assert resp.status == 200 and "Rescheduled" in await resp.text()
        run_at = await pool.fetchval("SELECT run_at FROM pgfleet.jobs WHERE id = $1", queued)
        assert run_at.isoformat() == "2030-01-01T00:00:00+00:00"
        # Logging out ends the session in this browser.
        async with http.post(f"{api.url}/ui/logout", data={"csrf": csrf}) as resp:
            assert resp.url.path == "/ui/login"
        async with http.get(f"{api.url}/ui/", allow_redirects=False) as resp:
            assert resp.status == 303


async def test_a_database_that_does_not_answer_gives_a_503_page_without_its_address(
    fleet: Fleet,
) -> None:
    from tests.procs import free_port

    port = free_port()  # nothing listens there
    dsn = f"postgresql://console:s3cret-pw@127.0.0.1:{port}/nowhere"
    api = await fleet.api(dsn=dsn, env={"PGFLEET_API_TOKEN": TOKEN})
    async with session() as http:
        # Sessions live in the database: signing in needs it, and says so.
        async with http.get(f"{api.url}/ui/login") as resp:
            form = await resp.text()
        csrf = re.search(r'name="login_csrf" value="([^"]+)"', form)
        assert csrf, form
        data = {"token": TOKEN, "login_csrf": csrf.group(1), "next": "/ui/jobs"}
        async with http.post(f"{api.url}/ui/login", data=data, allow_redirects=False) as resp:
            text = await resp.text()
            assert resp.status == 503, text
            assert "did not answer" in text
            assert "s3cret" not in text and str(port) not in text and "nowhere" not in text
        # A cookie is looked up in the database: the same page, never the address.
        cookie = {"Cookie": "pgfleet_console=an-old-session"}
        for path in ("/ui/", "/ui/jobs", "/ui/workers", "/ui/crons"):
            async with http.get(f"{api.url}{path}", headers=cookie) as resp:
                text = await resp.text()
                assert resp.status == 503, (path, text)
                assert "did not answer" in text
                assert "s3cret" not in text and str(port) not in text and "nowhere" not in text
    assert "s3cret" not in api.proc.output()


async def test_the_job_page_shows_the_result_the_failed_attempts_and_cancels_a_running_job(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env={"PGFLEET_API_TOKEN": TOKEN})
    queue = Queue(pool)
    done = await queue.enqueue("send_email", {"to": "a"})
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', attempt = 2, finished_at = now(), "
        'started_at = now(), result = \'{"sent": "result-5d2a"}\', errors = jsonb_build_array('
        "jsonb_build_object('at', now(), 'attempt', 1, 'error', 'TimeoutError: attempt-9f3b', "
        "'worker', gen_random_uuid())) WHERE id = $1",
        done,
    )
    running = await queue.enqueue("send_email", {"to": "b"})
    await put_in_state(pool, running, "running", attempt=1)
    async with session() as http:
        await login(http, api.url)
        async with http.get(f"{api.url}/ui/jobs/{done}") as resp:
            text = await resp.text()
        assert resp.status == 200
        assert "result-5d2a" in text and "Failed attempts" in text and "attempt-9f3b" in text
        csrf = await page_csrf(http, f"{api.url}/ui/jobs/{running}")
        cancel = f"{api.url}/ui/jobs/{running}/cancel"
        async with http.post(cancel, data={"csrf": csrf}, allow_redirects=False) as resp:
            assert resp.status == 303
            assert resp.headers["Location"] == f"/ui/jobs/{running}?done=cancel_requested"
    job = await queue.get(running)
    assert job is not None and job.cancel_requested_at is not None
    assert job.cancelled_by == "console:api-token"


async def test_a_jobs_limit_key_is_on_its_page_its_api_view_and_filters_the_list(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(env={"PGFLEET_API_TOKEN": TOKEN})
    queue = Queue(pool)
    keyed = await queue.enqueue("export", options=EnqueueOptions(limit_key="tenant-4c1e"))
    plain = await queue.enqueue("export")
    async with session() as http:
        async with http.get(
            f"{api.url}/jobs/{keyed}", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["limit_key"] == "tenant-4c1e"
        await login(http, api.url)
        async with http.get(f"{api.url}/ui/jobs/{keyed}") as resp:
            text = await resp.text()
        assert resp.status == 200
        assert 'href="/ui/jobs?key=tenant-4c1e"' in text
        async with http.get(f"{api.url}/ui/jobs", params={"key": "tenant-4c1e"}) as resp:
            listed = await resp.text()
        assert resp.status == 200
        assert str(keyed) in listed and str(plain) not in listed
        async with http.get(f"{api.url}/ui/jobs", params={"key": "x" * 600}) as resp:
            assert resp.status == 400
            assert "limit_key" in await resp.text()
