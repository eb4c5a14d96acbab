"""The shipped Grafana dashboard parses and uses only metrics that exist (docs/metrics.md)."""
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dashboard_uses_documented_metrics():
    with open(os.path.join(ROOT, "deploy", "grafana-dashboard.json"), encoding="utf-8") as fh:
        dash = json.load(fh)
    documented = set(re.findall(r"`(aieng_[a-z_]+)`", open(os.path.join(ROOT, "docs", "metrics.md")).read()))
    used = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used.update(re.findall(r"aieng_[a-z_]+", target["expr"]))
    assert used, "no queries"
    for name in used:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert base in documented, f"{name} is not a documented metric"
    assert {re.sub(r"_(bucket|sum|count)$", "", n) for n in used} == documented, "every metric has a panel"
