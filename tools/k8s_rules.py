"""``python -m tools.k8s_rules``: write the PrometheusRule of the Kubernetes base.

deploy/rules/ is the one source of truth for the fleet's recording and alert rules
(Prometheus loads those files in the compose and native fleets). On Kubernetes the
Prometheus Operator takes them as a PrometheusRule object, whose ``spec.groups`` is
the same list of groups: this script copies them, unchanged and in order, into
deploy/kubernetes/base/prometheusrule.yaml. ``--check`` exits 1 when the committed
file differs from what it would write (tests/kubernetes runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "rules"
#: Rule files in the order Prometheus loads them (deploy/prometheus.yml).
RULE_FILES = ("recording.yml", "alerts.yml")
TARGET = ROOT / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/rules/{files} by `python -m tools.k8s_rules`: do not edit.
# Change the rule files and run it again; tests/kubernetes fails while they differ.
"""


def rule_groups(rules_dir: Path = RULES) -> list[dict[str, Any]]:
    """Every group of every rule file, in load order."""
    groups: list[dict[str, Any]] = []
    for name in RULE_FILES:
        with (rules_dir / name).open() as f:
            data = yaml.safe_load(f)
        if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
            raise ValueError(f"{rules_dir / name}: no list of rule groups")
        groups.extend(data["groups"])
    return groups


def render(rules_dir: Path = RULES) -> str:
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "pgfleet",
            "labels": {"app.kubernetes.io/part-of": "pgfleet"},
        },
        "spec": {"groups": rule_groups(rules_dir)},
    }
    body: str = yaml.safe_dump(rule, sort_keys=False, width=100, allow_unicode=True)
    return HEADER.format(files=", ".join(RULE_FILES)) + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if TARGET.read_text() != text:
            print(f"{TARGET} is stale: run python -m tools.k8s_rules", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
