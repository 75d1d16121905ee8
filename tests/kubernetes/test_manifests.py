"""deploy/kubernetes/: every target renders and every object validates, strictly.

Built-in kinds are checked against the Kubernetes API's own schemas
(``kubernetes-validate``, strict: an unknown field is an error) for the oldest
Kubernetes the documentation supports and the newest the package knows; KEDA and
Prometheus Operator kinds against the closed schemas in ``crds/``. Then what the
issue asks of the objects themselves: probes, grace periods, security context,
Secrets by reference only, rules identical to deploy/rules/, scrape job names that
the rules select on, and the two KEDA overlays agreeing on everything but the
trigger source.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.kubernetes.support import (
    BASE,
    CRDS,
    KEDA_OVERLAYS,
    ROOT,
    TARGETS,
    find,
    render,
    trigger,
)
from tools import k8s_rules

#: The oldest Kubernetes minor the documentation supports, and the newest schemas we have.
KUBERNETES_VERSIONS = ("1.27", kubernetes_validate.latest_version())
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication", "PodMonitor", "PrometheusRule"}
#: PGFLEET_SHUTDOWN_GRACE_PERIOD must fit in the pod's termination grace period.
DRAIN_SLACK = 10


def _crd_schemas() -> dict[str, dict[str, Any]]:
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for kind, schema in doc["kinds"].items():
            schemas[kind] = {**schema, "definitions": doc["definitions"]}
    return schemas


CRD_SCHEMAS = _crd_schemas()


def validate_custom(obj: dict[str, Any]) -> None:
    schema = CRD_SCHEMAS.get(obj["kind"])
    assert schema is not None, f"no schema in tests/kubernetes/crds for {obj['kind']}"
    jsonschema.validate(obj, schema)


def validate_builtin(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def seconds_env(container: dict[str, Any], name: str) -> float:
    return float(env_of(container)[name]["value"])


# ------------------------------------------------------------------ schemas


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_strictly(target: str) -> None:
    objects = render(target)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "PodDisruptionBudget", "Service", "NetworkPolicy"} <= kinds
    for obj in objects:
        assert obj["metadata"].get("namespace") == "pgfleet", obj["metadata"]
        if obj["kind"] in CUSTOM_KINDS:
            validate_custom(obj)
        else:
            for version in KUBERNETES_VERSIONS:
                validate_builtin(obj, version)


def test_strict_validation_rejects_what_it_should() -> None:
    """The validators are not vacuous: a misspelt field fails each kind we ship."""
    objects = render(f"overlays/{KEDA_OVERLAYS[0]}")
    deployment = copy.deepcopy(find(objects, "Deployment", "pgfleet-worker"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_builtin(deployment, KUBERNETES_VERSIONS[-1])
    for kind in sorted(CUSTOM_KINDS):
        found = [o for t in TARGETS for o in render(t) if o["kind"] == kind]
        broken = copy.deepcopy(found[0])
        broken["spec"]["unknownField"] = 1
        with pytest.raises(jsonschema.ValidationError):
            validate_custom(broken)
    scaled = copy.deepcopy(find(objects, "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["targetValue"] = "3"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(scaled)


@pytest.mark.parametrize("overlay", KEDA_OVERLAYS)
def test_keda_overlays_add_a_scaled_object_and_leave_replicas_to_it(overlay: str) -> None:
    objects = render(f"overlays/{overlay}")
    worker = find(objects, "Deployment", "pgfleet-worker")
    assert "replicas" not in worker["spec"], "the HPA owns the replica count"
    scaled = find(objects, "ScaledObject", "pgfleet-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    # The base alone keeps a fixed replica count.
    assert find(render("base"), "Deployment", "pgfleet-worker")["spec"]["replicas"] >= 2


def test_both_keda_overlays_scale_alike() -> None:
    """Same bounds, behaviour and targets; only the source of the signal differs."""
    specs = {o: find(render(f"overlays/{o}"), "ScaledObject")["spec"] for o in KEDA_OVERLAYS}
    assert set(specs) == {"keda-postgres", "keda-prometheus"}
    stripped = {o: {k: v for k, v in s.items() if k != "triggers"} for o, s in specs.items()}
    assert stripped["keda-postgres"] == stripped["keda-prometheus"]

    def targets(spec: dict[str, Any]) -> dict[str, str]:
        return {
            t["name"]: t["metadata"].get("targetQueryValue") or t["metadata"]["threshold"]
            for t in spec["triggers"]
        }

    assert targets(specs["keda-postgres"]) == targets(specs["keda-prometheus"])
    assert set(targets(specs["keda-postgres"])) == {"running-and-due", "oldest-due-age"}


def test_scaling_bounds_and_behaviour_are_sensible() -> None:
    scaled = find(render("overlays/keda-postgres"), "ScaledObject")
    spec = scaled["spec"]
    # Cron schedules and the metrics lease need a live worker: never scale to zero.
    assert spec["minReplicaCount"] >= 1
    assert "idleReplicaCount" not in spec
    assert spec["maxReplicaCount"] > spec["minReplicaCount"]
    # Each replica may open up to concurrency + 4 connections.
    assert spec["maxReplicaCount"] * (16 + 4) <= 500
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] <= 30
    pg = trigger(scaled, "running-and-due")
    assert pg["authenticationRef"]["name"] == "pgfleet-postgres"


# ------------------------------------------------------------------ workers, api


def test_worker_pods_are_hardened_probed_and_drain_in_time() -> None:
    objects = render("base")
    for name in ("pgfleet-worker", "pgfleet-api"):
        pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert c["resources"]["requests"]["memory"], c["name"]
            assert c["resources"]["limits"]["memory"], c["name"]
        for c in pod["containers"]:
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert c["livenessProbe"]["httpGet"]["port"] in ports
        assert {s["topologyKey"] for s in pod["topologySpreadConstraints"]} >= {
            "kubernetes.io/hostname"
        }

    worker = find(objects, "Deployment", "pgfleet-worker")["spec"]["template"]["spec"]
    (container,) = worker["containers"]
    assert container["command"] == ["pgfleet", "worker"]
    grace = seconds_env(container, "PGFLEET_SHUTDOWN_GRACE_PERIOD")
    assert worker["terminationGracePeriodSeconds"] >= grace + DRAIN_SLACK
    assert env_of(container)["PGFLEET_PROCESSES"]["value"] == "1"
    (migrate,) = worker["initContainers"]
    assert migrate["command"] == ["pgfleet", "migrate"]
    assert migrate["image"] == container["image"]
    # The port the probes and the PodMonitor use is the one the worker serves.
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == int(
        env_of(container)["PGFLEET_METRICS_PORT"]["value"]
    )
    api = find(objects, "Deployment", "pgfleet-api")["spec"]["template"]["spec"]
    (api_container,) = api["containers"]
    assert api["terminationGracePeriodSeconds"] >= (
        seconds_env(api_container, "PGFLEET_API_SHUTDOWN_TIMEOUT") + DRAIN_SLACK
    )


def test_disruption_budget_lets_node_drains_through() -> None:
    pdb = find(render("base"), "PodDisruptionBudget", "pgfleet-worker")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "pgfleet-worker"}},
    }


def test_api_service_selects_the_api_pods_on_its_http_port() -> None:
    objects = render("base")
    service = find(objects, "Service", "pgfleet-api")
    pods = find(objects, "Deployment", "pgfleet-api")["spec"]["template"]
    for key, value in service["spec"]["selector"].items():
        assert pods["metadata"]["labels"][key] == value
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


SECRET_ENV = {"PGFLEET_DATABASE_URL": "database-url"}


@pytest.mark.parametrize("target", TARGETS)
def test_credentials_come_from_secrets_only(target: str) -> None:
    objects = render(target)
    assert not [o for o in objects if o["kind"] == "Secret"], "no Secret is shipped"
    text = yaml.safe_dump_all(objects)
    assert not re.search(r"postgres(ql)?://[^\s\"']*@", text), "a literal database URL"
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            for name, env in env_of(c).items():
                if name in SECRET_ENV or re.search(r"TOKEN|PASSWORD|SECRET|URL", name):
                    assert "value" not in env, (c["name"], name)
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref == {"name": "pgfleet", "key": SECRET_ENV[name]}
    for auth in (o for o in objects if o["kind"] == "TriggerAuthentication"):
        # KEDA reads with a read-only role of its own (keda-role.sql), never the
        # workers' read-write URL.
        assert auth["spec"]["secretTargetRef"] == [
            {"parameter": "connection", "name": "pgfleet-keda", "key": "database-url"}
        ]


def test_the_api_reads_named_credentials_from_a_mounted_secret() -> None:
    api = find(render("base"), "Deployment", "pgfleet-api")
    pod = api["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    assert "PGFLEET_API_TOKEN" not in env, "one token for producers and operators"
    path = env["PGFLEET_API_CREDENTIALS_FILE"]["value"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "pgfleet"
    assert volume["secret"]["items"] == [{"key": "api-credentials", "path": "api-credentials"}]


# ------------------------------------------------------------------ monitoring


def test_prometheus_rule_is_deploy_rules_verbatim() -> None:
    committed = (BASE / "prometheusrule.yaml").read_text()
    assert committed == k8s_rules.render(), "stale: run python -m tools.k8s_rules"
    rule = find(render("base"), "PrometheusRule", "pgfleet")
    expected = []
    for name in k8s_rules.RULE_FILES:
        expected += yaml.safe_load((ROOT / "deploy" / "rules" / name).read_text())["groups"]
    assert rule["spec"]["groups"] == expected
    alerts = [r["alert"] for g in expected for r in g["rules"] if "alert" in r]
    assert "PgfleetBacklogAgeHigh" in alerts


def test_generator_check_mode_detects_a_stale_file(tmp_path: Any, monkeypatch: Any) -> None:
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(k8s_rules.render().replace("for: 5m", "for: 6m"))
    monkeypatch.setattr(k8s_rules, "TARGET", stale)
    assert k8s_rules.main(["--check"]) == 1
    stale.write_text(k8s_rules.render())
    assert k8s_rules.main(["--check"]) == 0


def test_pod_monitor_gives_the_job_names_the_rules_select() -> None:
    objects = render("base")
    monitor = find(objects, "PodMonitor", "pgfleet")
    label = monitor["spec"]["jobLabel"]
    rules_text = (ROOT / "deploy" / "rules" / "alerts.yml").read_text()
    (expr,) = monitor["spec"]["selector"]["matchExpressions"]
    for name in ("pgfleet-worker", "pgfleet-api"):
        labels = find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        # job="<value of the jobLabel pod label>", as the Operator builds it.
        assert labels[label] == name
        assert labels[expr["key"]] in expr["values"]
        ports = find(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert "metrics" in {p["name"] for p in ports["ports"]}
    assert 'job="pgfleet-worker"' in rules_text
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_network_policy_opens_metrics_to_monitoring_and_api_to_producers() -> None:
    objects = render("base")
    worker = find(objects, "NetworkPolicy", "pgfleet-worker")
    api = find(objects, "NetworkPolicy", "pgfleet-api")
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    assert worker["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert worker["spec"]["ingress"] == [
        {"from": [monitoring], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    ]
    metrics_rule, http_rule = api["spec"]["ingress"]
    assert metrics_rule == {"from": [monitoring], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    assert http_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert monitoring not in http_rule["from"]
    for policy, name in ((worker, "pgfleet-worker"), (api, "pgfleet-api")):
        assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": name}}


def test_network_policies_let_pgfleet_pods_reach_dns_and_postgresql_only() -> None:
    objects = render("base")
    for name in ("pgfleet-worker", "pgfleet-api"):
        policy = find(objects, "NetworkPolicy", name)
        assert "Egress" in policy["spec"]["policyTypes"], name
        ports = sorted(
            (p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]
        )
        assert ports == [(53, "TCP"), (53, "UDP"), (5432, "TCP")], name
