"""`docker compose up` for real: the containerised fleet built, started and exercised.

One test, in steps that each depend on the ones before (a failed step fails the test
and the stack is torn down): build -> up --wait -> jobs through the API -> Prometheus
-> the image's HEALTHCHECK outside compose -> scale -> SIGKILL and restart under load
-> stop with jobs in flight -> the locust profile -> down -v. Each step's wall time is
printed as it finishes and again at the end of the run.

It needs a Docker engine with Compose v2 and is skipped, saying why, only when no
engine answers. On a machine without an image registry, `.ci/run` provides one with
../shared/docker-lab/provision.sh, whose stand-in images are named through
PGFLEET_{PYTHON,POSTGRES,PROMETHEUS}_IMAGE and whose override file
(PGFLEET_LAB_COMPOSE_FILE) builds on the host network and parks Grafana.
"""

from __future__ import annotations

import csv
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compose.stack import ROOT, Stack, Steps, engine_problem, run, versions, wait_until

#: The reference app's kinds (worker/app.py) that the API step runs.
JOB_NAMES = ("noop", "sleep", "cpu", "send_email", "fail")

_problem = engine_problem()
pytestmark = [
    pytest.mark.skipif(
        _problem is not None,
        reason=f"{_problem}: the compose smoke test needs a Docker engine with Compose v2 "
        "(.ci/run provides one with ../shared/docker-lab/provision.sh)",
    ),
    pytest.mark.timeout(1800),
]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path)
    try:
        yield stack
    finally:
        for name in (f"{stack.project}-api-alone", f"{stack.project}-worker-alone"):
            run(["docker", "rm", "-f", name], check=False)
        stack.compose(
            "--profile", "loadtest", "down", "-v", "--remove-orphans", "-t", "5",
            timeout=300, check=False,
        )  # fmt: skip


#: Run in a worker container: SIGKILL the `pgfleet worker` process (PID 1 is the init).
KILL_PGFLEET = """
import os, signal
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != 1:
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if any(arg.endswith(b"/pgfleet") for arg in argv[:2]) and b"worker" in argv:
            print(pid, flush=True)  # first: this exec may die with the container
            os.kill(int(pid), signal.SIGKILL)
"""


def all_succeeded(stack: Stack, ids: list[str]) -> bool | None:
    """True once every job succeeded; fails at once when one is lost or dead."""
    statuses = stack.statuses(ids)
    assert not {"missing", "failed", "cancelled"} & set(statuses), statuses
    return True if statuses == {"succeeded": len(ids)} else None


def sleep_jobs(n: int, low_ms: int, high_ms: int) -> list[dict[str, Any]]:
    rng = random.Random(n)
    return [{"name": "sleep", "payload": {"ms": rng.randint(low_ms, high_ms)}} for _ in range(n)]


def test_compose_fleet_end_to_end(stack: Stack, steps: Steps) -> None:
    found = versions()
    steps.note(
        f"Docker engine {found['engine']}, Compose {found['compose']}"
        + (
            "; stand-in images of ../shared/docker-lab (no registry): "
            + ", ".join(
                os.environ.get(v, "?")
                for v in (
                    "PGFLEET_PYTHON_IMAGE",
                    "PGFLEET_POSTGRES_IMAGE",
                    "PGFLEET_PROMETHEUS_IMAGE",
                )
            )
            if stack.lab
            else ""
        )
    )
    expected = sorted(stack.services)

    # --- build: the pgfleet image once ------------------------------------------------
    with steps("docker compose build (the pgfleet image, once)"):
        built = stack.compose("build", "--progress", "plain", timeout=900)
        log = built.stdout + built.stderr
        named = re.findall(r"naming to (\S+)", log)
        assert named == [f"docker.io/library/{stack.image}"], (
            f"one image built, once: {named}\n{log[-3000:]}"
        )
        assert "build-essential" not in log
    size = int(run(["docker", "image", "inspect", "-f", "{{.Size}}", stack.image]).stdout)
    steps.note(f"image {stack.image}: {size / 1e6:.0f} MB")

    # --- up --wait: every service healthy, migrate exited 0 -----------------------------
    with steps("docker compose up --wait: every service healthy, migrate exited 0"):
        stack.compose("up", "-d", "--wait", timeout=300)
        rows = stack.containers()
        assert sorted({r["Service"] for r in rows}) == expected
        for row in rows:
            if row["Service"] == "migrate":
                assert row["State"] == "exited" and row["ExitCode"] == 0, row
            else:
                assert row["State"] == "running" and row["Health"] == "healthy", row
        assert len([r for r in rows if r["Service"] == "worker"]) == 3
        # Every pgfleet service runs the one image built above.
        image_id = stack.inspect(stack.image)["Id"]
        for row in rows:
            if row["Service"] in ("migrate", "worker", "api"):
                assert stack.inspect(row["ID"])["Image"] == image_id, row["Name"]

    # The image's own HEALTHCHECK (not compose's) for `pgfleet api` and `pgfleet worker`
    # run by hand, as `docker run` users do; checked further down, once they had time.
    alone = {}
    network = f"{stack.project}_default"
    dsn = f"postgresql://pgfleet:{stack.postgres_password}@postgres:5432/pgfleet"
    for command in ("api", "worker"):
        name = alone[command] = f"{stack.project}-{command}-alone"
        run(
            [
                "docker", "run", "-d", "--name", name, "--network", network,
                "--health-interval", "2s", "--health-start-period", "60s",
                "-e", f"PGFLEET_DATABASE_URL={dsn}", stack.image, "pgfleet", command,
            ]
        )  # fmt: skip

    # --- the jobs API: with the token every job succeeds; without it, 401 ---------------
    with steps("jobs through the API: all succeed with the token, 401 without"):
        jobs = (
            [{"name": "noop", "payload": None}] * 20
            + sleep_jobs(10, 100, 300)
            + [{"name": "cpu", "payload": {"ms": 20}}] * 5
            + [
                {"name": "send_email", "payload": {"address": f"user{i}@example.test"}}
                for i in range(5)
            ]
        )
        ids = stack.post_jobs(jobs)
        assert len(ids) == len(jobs)
        (fail_id,) = stack.post_jobs([{"name": "fail", "payload": None}])
        wait_until("the API's jobs to succeed", lambda: all_succeeded(stack, ids), timeout=90)
        status, _headers, record = stack.api("GET", f"/jobs/{ids[0]}")
        assert status == 200 and record["status"] == "succeeded", record
        wait_until(
            "the fail job to be dead",
            lambda: True if stack.api("GET", f"/jobs/{fail_id}")[2]["status"] == "failed" else None,
            timeout=60,
        )
        before = stack.psql("SELECT count(*) FROM pgfleet.jobs")[0][0]
        for token in (None, "not-the-token"):
            for method, path, body in (
                ("POST", "/jobs", {"name": "noop", "payload": None}),
                ("GET", f"/jobs/{ids[0]}", None),
                ("GET", "/jobs", None),
            ):
                status, headers, answer = stack.api(method, path, body, token=token)
                assert status == 401, (method, path, token, status, answer)
                assert headers.get("WWW-Authenticate", "").startswith("Bearer"), headers
        assert stack.psql("SELECT count(*) FROM pgfleet.jobs")[0][0] == before
        # The operator console ships in the image: its login page and static files.
        assert stack.get_status("/ui/login") == 200
        assert stack.get_status("/ui/static/console.css") == 200

    # --- Prometheus, from inside the network ----------------------------------------
    with steps("Prometheus: 3 worker targets and the api up, the SPEC metrics reported"):
        wait_until(
            "3 worker targets and the api up",
            lambda: (
                True
                if (t := stack.targets_up()).get("pgfleet-worker") == 3
                and t.get("pgfleet-api") == 1
                else None
            ),
            timeout=90,
            interval=2,
        )

        def by_kind(expr: str) -> dict[str, float]:
            return {r["metric"]["kind"]: float(r["value"][1]) for r in stack.query(expr)}

        def spec_metrics() -> dict[str, dict[str, float]] | None:
            found = {
                "queued": by_kind("max by (kind) (pgfleet_jobs_queued)"),
                "oldest age": by_kind("max by (kind) (pgfleet_oldest_queued_job_age_seconds)"),
                "dead": by_kind("max by (kind) (pgfleet_jobs_dead)"),
                "p95 duration": by_kind(
                    "histogram_quantile(0.95, sum by (kind, le) "
                    "(rate(pgfleet_job_duration_seconds_bucket[5m])))"
                ),
            }
            complete = (
                all(set(JOB_NAMES) <= set(values) for values in found.values())
                and found["dead"]["fail"] >= 1
                and 0.05 <= found["p95 duration"]["sleep"] < 10
            )
            if not complete:
                # A rate needs two scrapes around the work: give it more, then look again.
                stack.post_jobs(sleep_jobs(10, 100, 300))
                return None
            return found

        metrics = wait_until("the SPEC metrics", spec_metrics, timeout=120, interval=5)
        steps.note(
            "Prometheus: dead[fail]={:.0f}, p95 duration[sleep]={:.3f} s".format(
                metrics["dead"]["fail"], metrics["p95 duration"]["sleep"]
            )
        )

    with steps("the image's HEALTHCHECK outside compose: `pgfleet api` and `pgfleet worker`"):
        for name in alone.values():
            config = stack.inspect(name)["Config"]["Healthcheck"]
            assert config["Test"][-1] == "/app/worker/healthcheck.py", config

            def healthy(name: str = name) -> bool | None:
                state = stack.inspect(name)["State"]
                assert state["Running"], f"{name} exited: {state}"
                status = state["Health"]["Status"]
                assert status != "unhealthy", state["Health"]["Log"][-1:]
                return True if status == "healthy" else None

            wait_until(f"{name} healthy", healthy, timeout=90)
        for name in alone.values():
            run(["docker", "stop", "-t", "45", name], timeout=120)
            run(["docker", "rm", name])

    # --- scale ------------------------------------------------------------------------
    with steps("--scale worker=5: Prometheus finds 5 worker targets"):
        stack.compose("up", "-d", "--wait", "--scale", "worker=5", timeout=300)
        assert len(stack.containers("worker")) == 5
        wait_until(
            "5 worker targets up",
            lambda: True if stack.targets_up().get("pgfleet-worker") == 5 else None,
            timeout=90,
            interval=2,
        )

    # --- chaos under load -----------------------------------------------------------------
    with steps("under load: one worker SIGKILLed, one restarted: no job lost"):
        ids = stack.post_jobs(sleep_jobs(400, 500, 1500))
        more: list[str] = []
        errors: list[BaseException] = []

        def keep_posting() -> None:
            try:
                for _ in range(10):
                    more.extend(stack.post_jobs(sleep_jobs(20, 200, 800)))
                    time.sleep(0.5)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        producer = threading.Thread(target=keep_posting, name="producer")
        producer.start()
        # Docker names a container's host after its id: the workers table says which
        # replica holds which running jobs. Kill and restart replicas that hold some.
        hostnames = {
            stack.inspect(r["ID"])["Config"]["Hostname"]: r["Name"]
            for r in stack.containers("worker")
        }

        def busy_replicas() -> list[tuple[str, int]] | None:
            rows = stack.psql(
                "SELECT w.hostname, count(*) FROM pgfleet.jobs j "
                "JOIN pgfleet.workers w ON w.id = j.locked_by "
                "WHERE j.status = 'running' GROUP BY 1 ORDER BY 2 DESC"
            )
            busy = [(hostnames[h], int(n)) for h, n in rows if h in hostnames]
            return busy if len(busy) >= 2 else None

        busy = wait_until("two replicas running jobs", busy_replicas, timeout=60, interval=0.5)
        (killed, held), (restarted, _n) = busy[0], busy[1]
        restarts = stack.inspect(killed)["RestartCount"]
        # The pgfleet process itself, as a crash or the OOM killer would: PID 1 is the
        # init (`init: true`), so the container exits and its restart policy applies.
        # The container stops with its pgfleet process, and `docker exec` may be
        # killed with it (exit 137) before it returns: the printed pid is the proof.
        kill = run(["docker", "exec", killed, "python", "-c", KILL_PGFLEET], check=False)
        killed_pids = kill.stdout.split()
        assert kill.returncode in (0, 137), (kill.returncode, kill.stdout, kill.stderr)
        assert len(killed_pids) == 1, (killed_pids, kill.stderr)
        run(["docker", "restart", "-t", "45", restarted], timeout=120)
        producer.join(timeout=60)
        assert not errors, errors
        everything = ids + more
        wait_until(
            f"all {len(everything)} jobs to succeed",
            lambda: all_succeeded(stack, everything),
            timeout=240,
            interval=2,
        )
        assert stack.inspect(killed)["RestartCount"] > restarts, "the restart policy applied"
        rescued = stack.psql(
            "SELECT count(*) FROM pgfleet.jobs "
            "WHERE attempt > 1 AND last_error LIKE '%stopped heartbeating%'"
        )[0][0]
        steps.note(
            f"chaos: {len(everything)} jobs, all succeeded; the killed replica held {held} "
            f"running, {rescued} rescued and run again"
        )
        assert int(rescued) >= 1, "the killed worker's running jobs were rescued and re-run"

    # --- stop drains ------------------------------------------------------------------
    with steps("docker compose stop with jobs in flight: drained, none left running"):
        ids = stack.post_jobs(sleep_jobs(300, 2000, 4000))
        wait_until(
            "jobs running",
            lambda: True if stack.statuses(ids).get("running", 0) >= 20 else None,
            timeout=60,
            interval=0.5,
        )
        stack.compose("stop", timeout=300)
        rows = stack.containers()
        for row in rows:
            assert row["State"] == "exited", row
            if row["Service"] in ("migrate", "worker", "api"):
                assert row["ExitCode"] == 0, row
        stack.compose("up", "-d", "--wait", "postgres", timeout=120)
        after = stack.statuses(ids)
        assert set(after) <= {"succeeded", "queued"}, after
        steps.note(f"stop: {after.get('succeeded', 0)} finished, {after.get('queued', 0)} queued")

    # --- the locust profile -------------------------------------------------------------
    with steps("docker compose --profile loadtest build locust"):
        built = stack.compose(
            "--profile", "loadtest", "build", "--progress", "plain", "locust", timeout=900
        )
        named = re.findall(r"naming to (\S+)", built.stdout + built.stderr)
        assert named == [f"docker.io/library/{stack.loadtest_image}"], named
    size = int(run(["docker", "image", "inspect", "-f", "{{.Size}}", stack.loadtest_image]).stdout)
    steps.note(f"image {stack.loadtest_image}: {size / 1e6:.0f} MB")

    with steps("the locust profile headless: CSV results readable by the user"):
        results = ROOT / "loadtest" / "results"
        started = time.time()
        stack.env.update(
            {
                "LOCUST_UID": str(os.getuid()),
                "LOCUST_GID": str(os.getgid()),
                "LOCUST_USERS": "4",
                "LOCUST_SPAWN_RATE": "4",
                "LOCUST_RUN_TIME": "10s",
            }
        )
        stack.compose(
            "--profile", "loadtest", "up", "--exit-code-from", "locust", "locust",
            timeout=300,
        )  # fmt: skip
        stats = results / "compose_stats.csv"
        for written in (stats, results / "compose_stats_history.csv"):
            assert written.stat().st_mtime >= started - 1, f"{written} was not written by this run"
            assert written.stat().st_uid == os.getuid(), (
                f"{written} is owned by {written.stat().st_uid}"
            )
            assert os.access(written, os.R_OK | os.W_OK), written
        with stats.open() as f:
            aggregated = [row for row in csv.DictReader(f) if row["Name"] == "Aggregated"]
        assert aggregated and int(aggregated[0]["Request Count"]) > 0, aggregated
        steps.note(f"locust: {aggregated[0]['Request Count']} requests, results in {results}")

    # --- down -v --------------------------------------------------------------------
    with steps("docker compose down -v: nothing left"):
        stack.compose("--profile", "loadtest", "down", "-v", "--remove-orphans", timeout=300)
        label = f"label=com.docker.compose.project={stack.project}"
        assert run(["docker", "ps", "-a", "-q", "--filter", label]).stdout.strip() == ""
        assert run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.strip() == ""
        assert run(["docker", "network", "ls", "-q", "--filter", label]).stdout.strip() == ""
