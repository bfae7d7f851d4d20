"""The documented alert rules and configuration are valid YAML, name metrics that /metrics exports,
and (when promtool is installed) pass promtool's own checks."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from apps.resources.models import ResourcePool
from apps.scheduling.models import Device

DOCS = Path(__file__).resolve().parents[2] / "docs"
RULES = DOCS / "prometheus" / "gridgate-alerts.yml"
TOKEN = "t" * 32


def yaml_blocks(markdown: Path) -> list:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", markdown.read_text(), re.S)]


def rules_of(document) -> list[dict]:
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_alert_rules_file_is_a_valid_prometheus_rules_document():
    rules = rules_of(yaml.safe_load(RULES.read_text()))
    names = {rule["alert"] for rule in rules}
    assert {"GridgateWorkerDead", "GridgateNoWorkerAlive", "GridgatePoolSaturated", "GridgateCasePollsFailing"} <= names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["expr"].strip() and rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule["for"])


def test_metrics_doc_yaml_blocks_parse():
    scrape, rules = yaml_blocks(DOCS / "metrics.md")
    assert scrape["scrape_configs"][0]["metrics_path"] == "/metrics"
    assert scrape["scrape_configs"][0]["authorization"]["type"] == "Bearer"
    assert {rule["alert"] for rule in rules_of(rules)} <= {
        rule["alert"] for rule in rules_of(yaml.safe_load(RULES.read_text()))
    }


@pytest.mark.django_db
def test_every_metric_in_the_rules_and_the_doc_is_exported(client, settings):
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    pool = ResourcePool.objects.create(name="p", kind="local", public=True, slots_total=1)
    Device.objects.create(pool=pool, name="d", driver="fake")
    client.get("/api/v1/health/")  # one request observed, so the request histogram has samples
    body = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    exported = {family.name for family in text_string_to_metric_families(body)}
    exported |= {f"{name}_{suffix}" for name in exported for suffix in ("bucket", "count", "sum", "total")}
    referenced = set(re.findall(r"\bgridgate_[a-z_]+", RULES.read_text()))
    documented = set(re.findall(r"`(gridgate_[a-z_]+)`", (DOCS / "metrics.md").read_text()))
    assert referenced - exported == set()
    assert documented - exported == set()
    # A counter's family is named without "_total", the name scraped and documented.
    families = {name for name in exported if not name.endswith(("_bucket", "_count", "_sum", "_total"))}
    assert {name for name in families if name not in documented and f"{name}_total" not in documented} == set()


def test_promtool_checks_and_unit_tests_the_rules():
    if shutil.which("promtool") is None:
        reason = "promtool is not installed (.ci/run extracts it from Debian's prometheus package)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    subprocess.run(["promtool", "check", "rules", str(RULES)], check=True, timeout=60)
    subprocess.run(["promtool", "test", "rules", "gridgate-alerts.test.yml"], cwd=RULES.parent, check=True, timeout=60)
