"""Issue 15: the Prometheus alert rules and the Grafana dashboard in examples/ load, and every
metric they use is one the daemon's /metrics exposes. ``promtool check rules`` runs too when
promtool is on PATH (scripts/test unpacks it from Debian's ``prometheus`` package when apt can fetch it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from bridge.metrics import METRICS
from tests.conftest import ROOT

RULES = ROOT / "examples" / "prometheus" / "iva-alerts.yml"
DASHBOARD = ROOT / "examples" / "grafana" / "iva-dashboard.json"
_NAME = re.compile(r"\biva_[a-z_]+\b")
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created")}


def _exposed() -> set[str]:
    """Every series name /metrics can show (a labelled counter shows none until it counts)."""
    return {m.name + suffix for m in METRICS.registry.collect() for suffix in _SUFFIXES[m.type]}


def _exprs_of_rules() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    for rule in rules:
        assert {"alert", "expr", "labels", "annotations"} <= rule.keys(), rule
        assert rule["annotations"].get("summary"), rule["alert"]
    return [r["expr"] for r in rules]


def test_the_alert_rules_cover_the_failures_that_matter():
    exprs = " ".join(_exprs_of_rules())
    for needed in ("iva_telegram_poll_age_seconds", "iva_overdue_chats", "iva_oldest_pending_reply_seconds",
                   'iva_compactions_total{outcome="failed"}', "iva_queue_depth"):
        assert needed in exprs, needed


def test_every_metric_in_the_rules_and_the_dashboard_is_exposed():
    dashboard = json.loads(DASHBOARD.read_text())
    dash_exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in [*_exprs_of_rules(), *dash_exprs] for n in _NAME.findall(e)}
    assert used and not used - _exposed(), used - _exposed()


def test_the_poll_age_gauge_is_on_metrics():
    from prometheus_client import generate_latest

    assert b"# TYPE iva_telegram_poll_age_seconds gauge" in generate_latest(METRICS.registry)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not on PATH (apt-get install prometheus)")
def test_promtool_checks_the_rules():
    done = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


RULE_TESTS = ROOT / "examples" / "prometheus" / "iva-alerts.test.yml"


def test_each_mode_has_its_own_receiving_alert():
    """Polling's alert asks the poll's age of a polling bridge only; webhook mode has its own."""
    doc = yaml.safe_load(RULES.read_text())
    rules = {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}
    assert 'iva_telegram_mode{mode="polling"}' in rules["IvaPollingStopped"]
    assert "iva_webhook_healthy" in rules["IvaWebhookFailing"]
    assert 'iva_telegram_mode{mode="webhook"}' in rules["IvaWebhookFailing"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not on PATH (apt-get install prometheus)")
def test_promtool_tests_the_rules_with_series_of_both_modes():
    """examples/prometheus/iva-alerts.test.yml: a polling and a webhook bridge side by side; each
    mode's alert fires for its own bridge only (the poll's age grows in webhook mode, unread)."""
    done = subprocess.run(["promtool", "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                          timeout=60, cwd=RULE_TESTS.parent)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
