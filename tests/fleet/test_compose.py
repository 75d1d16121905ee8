"""docker-compose.yml: accepted by docker-compose, and the facts the fleet promises.

No Docker engine is needed here: `docker-compose config` validates and interpolates
the file without one. The facts are read from the file itself (anchors merged).
tests/compose/ runs the stack for real when an engine answers.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fleet.support import (
    COMPOSE,
    DEPLOY,
    DOCKERFILE,
    ROOT,
    binary,
    env_without,
    load_yaml,
    run,
)

SECRETS = {
    "POSTGRES_PASSWORD": "throwaway-postgres",
    "GRAFANA_ADMIN_PASSWORD": "throwaway-grafana",
    "PGFLEET_PRODUCER_TOKEN": "throwaway-producer-token-Xq3v9Lk2",
    "PGFLEET_OPERATOR_TOKEN": "throwaway-operator-token-Pw7m4Zr8",
}
#: The images compose pulls (and the base of the one it builds), by the variable that
#: overrides each, with the pinned default.
IMAGE_VARIABLES = {
    "PGFLEET_POSTGRES_IMAGE": "postgres:16.6-alpine@sha256:"
    "1d04b9ba1d4996401f2552b51beda8187f175c0645c091e4781134fc9c9a3eef",
    "PGFLEET_PROMETHEUS_IMAGE": "prom/prometheus:v2.55.1@sha256:"
    "2659f4c2ebb718e7695cb9b25ffa7d6be64db013daba13e05c875451cf51b0d3",
    "PGFLEET_GRAFANA_IMAGE": "grafana/grafana:11.4.0@sha256:"
    "d8ea37798ccc41061a62ab080f2676dda6bf7815558499f901bdb0f533a456fb",
    "PGFLEET_PYTHON_IMAGE": "python:3.11.11-slim-bookworm@sha256:"
    "081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5",
}
OPTIONAL = (
    "PGFLEET_API_BIND",
    "PGFLEET_API_PUBLISHED_PORT",
    "GRAFANA_BIND",
    "GRAFANA_PUBLISHED_PORT",
    "PGFLEET_IMAGE_TAG",
    "LOCUST_UID",
    "LOCUST_GID",
    *IMAGE_VARIABLES,
    "PGFLEET_API_UI",
    "PGFLEET_UI_HIDE_PAYLOADS",
    "PGFLEET_API_TRUSTED_PROXIES",
    "PGFLEET_UI_SECURE_COOKIES",
)


def compose_config(
    tmp_path: Path, values: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / "throwaway.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    # --env-file replaces ./.env, so a developer's own .env never leaks in.
    return run(
        [
            binary("docker-compose"),
            "--env-file",
            str(env_file),
            "-f",
            str(COMPOSE),
            *extra,
            "config",
        ],
        cwd=ROOT,
        env=env_without(*SECRETS, *OPTIONAL),
    )


def volume_mounts(volumes: list[str]) -> dict[str, str]:
    """{source: target} of short-syntax volumes ("src:/target[:ro]")."""
    return {v.split(":")[0]: v.split(":")[1] for v in volumes}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = compose["services"]
    return result


# --- docker-compose itself --------------------------------------------------------


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    result = compose_config(tmp_path, SECRETS)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert {"postgres", "migrate", "worker", "api", "prometheus", "grafana"} <= set(
        resolved["services"]
    )
    # Published ports resolve to loopback by default.
    for name in ("api", "grafana"):
        for port in resolved["services"][name]["ports"]:
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_docker_compose_config_accepts_the_loadtest_profile(tmp_path: Path) -> None:
    result = compose_config(tmp_path, SECRETS, "--profile", "loadtest")
    assert result.returncode == 0, result.stderr
    assert "locust" in yaml.safe_load(result.stdout)["services"]


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_run_without_each_secret(tmp_path: Path, missing: str) -> None:
    values = {k: v for k, v in SECRETS.items() if k != missing}
    result = compose_config(tmp_path, values)
    assert result.returncode != 0
    assert missing in result.stderr + result.stdout


# --- images -------------------------------------------------------------------------


def default_of(value: str) -> str:
    """The default of a `${VAR:-default}` value, else the value itself."""
    match = re.fullmatch(r"\$\{\w+:-([^}]+)\}", value)
    return match.group(1) if match else value


def test_every_image_is_pinned_to_an_explicit_version(services: dict[str, Any]) -> None:
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image name"
        assert "latest" not in image, f"{name}: {image!r}"
        if re.fullmatch(r"pgfleet(-loadtest)?:\$\{PGFLEET_IMAGE_TAG:-local\}", image):
            # Built here from worker/Dockerfile, whose base is pinned (test_image.py);
            # tagged locally.
            continue
        image = default_of(image)
        if "build" in service:
            raise AssertionError(f"{name} builds an image not named pgfleet:<tag>: {image!r}")
        else:
            # PostgreSQL releases are major.minor (16.6); everything else major.minor.patch.
            # A tag a person can read, and the digest that cannot be pushed again.
            version = r"\d+\.\d+" if image.startswith("postgres:") else r"v?\d+\.\d+\.\d+"
            pattern = r"[a-z0-9/._-]+:" + version + r"(-[a-z0-9.]+)?@sha256:[0-9a-f]{64}"
            assert re.fullmatch(pattern, image), (
                f"{name}: {image!r} is not pinned to an exact version and digest"
            )


def test_the_pgfleet_image_is_built_by_one_service_only(services: dict[str, Any]) -> None:
    # Each service with a `build:` section builds: three of them built the same image
    # three times, leaving two dangling copies and an arbitrary one tagged.
    runtime = [
        n for n, s in services.items() if s["image"] == "pgfleet:${PGFLEET_IMAGE_TAG:-local}"
    ]
    assert sorted(runtime) == ["api", "migrate", "worker"]
    builders = [n for n, s in services.items() if "build" in s]
    assert sorted(builders) == ["locust", "migrate"]
    assert services["migrate"]["build"]["target"] == "runtime"
    assert services["locust"]["build"]["target"] == "loadtest"
    for name in builders:
        build = services[name]["build"]
        assert build["context"] == "." and build["dockerfile"] == "worker/Dockerfile", name
        assert build["args"] == {
            "PYTHON_IMAGE": "${PGFLEET_PYTHON_IMAGE:-"
            + IMAGE_VARIABLES["PGFLEET_PYTHON_IMAGE"]
            + "}"
        }
    # Every service running the image starts after the one that builds it.
    for name in ("worker", "api"):
        assert "migrate" in services[name]["depends_on"], name


def test_image_names_are_overridable_with_pinned_defaults(
    services: dict[str, Any], tmp_path: Path
) -> None:
    declared = {
        "PGFLEET_POSTGRES_IMAGE": services["postgres"]["image"],
        "PGFLEET_PROMETHEUS_IMAGE": services["prometheus"]["image"],
        "PGFLEET_GRAFANA_IMAGE": services["grafana"]["image"],
        "PGFLEET_PYTHON_IMAGE": services["migrate"]["build"]["args"]["PYTHON_IMAGE"],
    }
    for variable, default in IMAGE_VARIABLES.items():
        assert declared[variable] == "${" + variable + ":-" + default + "}", variable
    # The Dockerfile's own default is the same pinned image.
    dockerfile_arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert dockerfile_arg and dockerfile_arg.group(1) == IMAGE_VARIABLES["PGFLEET_PYTHON_IMAGE"]

    def resolved(values: dict[str, str]) -> dict[str, str]:
        result = compose_config(tmp_path, values, "--profile", "loadtest")
        assert result.returncode == 0, result.stderr
        svc = yaml.safe_load(result.stdout)["services"]
        return {
            "PGFLEET_POSTGRES_IMAGE": svc["postgres"]["image"],
            "PGFLEET_PROMETHEUS_IMAGE": svc["prometheus"]["image"],
            "PGFLEET_GRAFANA_IMAGE": svc["grafana"]["image"],
            "PGFLEET_PYTHON_IMAGE": svc["migrate"]["build"]["args"]["PYTHON_IMAGE"],
            "locust": svc["locust"]["build"]["args"]["PYTHON_IMAGE"],
        }

    assert resolved(SECRETS) == {
        **IMAGE_VARIABLES,
        "locust": IMAGE_VARIABLES["PGFLEET_PYTHON_IMAGE"],
    }
    mirror = {v: f"mirror.example:5000/{d}" for v, d in IMAGE_VARIABLES.items()}
    assert resolved({**SECRETS, **mirror}) == {
        **mirror,
        "locust": mirror["PGFLEET_PYTHON_IMAGE"],
    }


# --- health and order -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["postgres", "worker", "api", "prometheus", "grafana"])
def test_long_running_services_have_healthchecks(services: dict[str, Any], name: str) -> None:
    check = services[name]["healthcheck"]
    assert not check.get("disable"), name
    assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_postgres_is_checked_with_pg_isready_and_keeps_its_data(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    postgres = services["postgres"]
    assert "pg_isready" in postgres["healthcheck"]["test"]
    (volume,) = postgres["volumes"]
    name, _, target = volume.partition(":")
    assert target == "/var/lib/postgresql/data"
    assert name in compose["volumes"], "a named volume, not a host path"


def test_pgfleet_healthchecks_hit_healthz_on_the_metrics_ports(services: dict[str, Any]) -> None:
    assert services["worker"]["healthcheck"]["test"][-2:] == ["/app/worker/healthcheck.py", "9464"]
    assert services["api"]["healthcheck"]["test"][-2:] == ["/app/worker/healthcheck.py", "9465"]
    assert services["api"]["environment"]["PGFLEET_API_METRICS_PORT"] == "9465"


def test_the_api_serves_the_console_by_default(services: dict[str, Any]) -> None:
    env = services["api"]["environment"]
    # On unless .env says otherwise; operators sign in with PGFLEET_OPERATOR_TOKEN.
    assert env["PGFLEET_API_UI"] == "${PGFLEET_API_UI:-1}"
    assert env["PGFLEET_UI_HIDE_PAYLOADS"] == "${PGFLEET_UI_HIDE_PAYLOADS:-0}"


def test_start_order(services: dict[str, Any]) -> None:
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("worker", "api"):
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"}
        }, name
    assert services["migrate"]["command"] == ["pgfleet", "migrate"]
    assert services["migrate"]["restart"] == "no"


# --- the worker replicas ----------------------------------------------------------------


def test_worker_runs_three_scalable_replicas_reachable_by_prometheus(
    services: dict[str, Any],
) -> None:
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == 3
    assert "container_name" not in worker, "a fixed name prevents --scale"
    assert "ports" not in worker, "worker metrics stay on the compose network"
    env = worker["environment"]
    assert env["PGFLEET_METRICS_HOST"] == "0.0.0.0"
    assert env["PGFLEET_METRICS_PORT"] == "9464"
    assert env["PGFLEET_APP"] == "worker.app:registry"
    assert env["PGFLEET_CRONS"] == "worker.app:crons"


def test_no_service_has_a_fixed_container_name(services: dict[str, Any]) -> None:
    assert [n for n, s in services.items() if "container_name" in s] == []


# --- what reaches the host ----------------------------------------------------------------


def test_only_api_and_grafana_are_published_and_on_loopback(services: dict[str, Any]) -> None:
    published = {n for n, s in services.items() if s.get("ports")}
    assert published == {"api", "grafana"}
    for name in published:
        for port in services[name]["ports"]:
            assert re.match(r"\$\{\w+:-127\.0\.0\.1\}:", str(port)), (name, port)
    for name, service in services.items():
        assert "expose" not in service, name
        assert service.get("network_mode") != "host", name


def test_no_metrics_port_is_published(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for port in service.get("ports", []):
            container_port = str(port).rsplit(":", 1)[-1].split("/")[0]
            assert container_port not in ("9464", "9465", "9090"), (name, port)


# --- secrets ----------------------------------------------------------------------------


def test_passwords_have_no_working_default() -> None:
    text = COMPOSE.read_text()
    assert "${POSTGRES_PASSWORD:?" in text
    assert "${GRAFANA_ADMIN_PASSWORD:?" in text
    for var in ("POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD", *SECRETS):
        for use in re.findall(r"\$\{" + var + r"([^}]*)\}", text):
            assert use.startswith(":?"), f"${{{var}{use}}} would start with a default"


def test_postgres_and_grafana_take_their_passwords_from_the_environment(
    services: dict[str, Any],
) -> None:
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_env_example_holds_placeholders_and_env_is_ignored() -> None:
    example = (ROOT / ".env.example").read_text()
    values = dict(
        line.split("=", 1)
        for line in example.splitlines()
        if line and not line.startswith("#") and "=" in line
    )
    assert set(SECRETS) <= set(values)
    for key in SECRETS:
        # Empty: compose's ${VAR:?} refuses an empty value, where a placeholder such as
        # change-me-api-token passed it and reached production.
        assert values[key] == "", key
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def test_producers_and_operators_have_their_own_credentials(services: dict[str, Any]) -> None:
    api = services["api"]["environment"]
    assert "PGFLEET_API_TOKEN" not in api, "one token for everything is the old setup"
    entries = api["PGFLEET_API_CREDENTIALS"].split(",")
    assert [e.split(":")[:2] for e in entries] == [
        ["producer", "producer"],
        ["operator", "operator"],
    ]
    assert "${PGFLEET_PRODUCER_TOKEN:?" in entries[0]
    assert "${PGFLEET_OPERATOR_TOKEN:?" in entries[1]
    # The load test is a producer, never an operator.
    locust = services["locust"]["environment"]
    assert locust["PGFLEET_API_TOKEN"].startswith("${PGFLEET_PRODUCER_TOKEN:?")


@pytest.mark.parametrize("name", ["migrate", "worker", "api", "locust"])
def test_pgfleet_containers_are_read_only_without_capabilities(
    services: dict[str, Any], name: str
) -> None:
    service = services[name]
    assert service["read_only"] is True
    assert service["tmpfs"] == ["/tmp"]
    assert service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]


# --- prometheus, grafana, locust ----------------------------------------------------------


def test_prometheus_loads_the_deploy_config_and_rules(services: dict[str, Any]) -> None:
    prometheus = services["prometheus"]
    assert "ports" not in prometheus
    mounts = volume_mounts(prometheus["volumes"])
    assert mounts["./deploy/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./deploy/rules"] == "/etc/prometheus/rules"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = load_yaml(DEPLOY / "prometheus.yml")
    for rule_file in config["rule_files"]:
        assert rule_file.startswith("rules/"), rule_file  # i.e. /etc/prometheus/rules/...
        assert (DEPLOY / rule_file).is_file(), rule_file


def test_grafana_is_provisioned_from_the_repo(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    mounts = volume_mounts(grafana["volumes"])
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./deploy/grafana/dashboards"] == "/etc/grafana/dashboards"
    provider = load_yaml(ROOT / "deploy/grafana/provisioning/dashboards/pgfleet.yml")["providers"][
        0
    ]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).name).is_file()


def test_locust_is_only_in_the_loadtest_profile(services: dict[str, Any]) -> None:
    locust = services["locust"]
    assert locust["profiles"] == ["loadtest"]
    assert locust["environment"]["LOCUST_LOCUSTFILE"] == "/app/loadtest/locustfile.py"
    assert "./loadtest:/app/loadtest" in locust["volumes"]
    assert locust["environment"]["LOCUST_CSV"].startswith("/app/loadtest/results/")
    for name, service in services.items():
        if name != "locust":
            assert "profiles" not in service, name


def test_locust_writes_its_results_as_the_user_set_in_the_environment(tmp_path: Path) -> None:
    # The image's user (10001) cannot write into a checkout owned by someone else,
    # and files it wrote would need sudo to remove: locust runs as LOCUST_UID:LOCUST_GID.
    def locust_user(values: dict[str, str]) -> str:
        result = compose_config(tmp_path, values, "--profile", "loadtest")
        assert result.returncode == 0, result.stderr
        user: str = yaml.safe_load(result.stdout)["services"]["locust"]["user"]
        return user

    assert locust_user(SECRETS) == "1000:1000"
    assert locust_user({**SECRETS, "LOCUST_UID": "4242", "LOCUST_GID": "4343"}) == "4242:4343"
    example = (ROOT / ".env.example").read_text()
    assert "LOCUST_UID" in example and "LOCUST_GID" in example
