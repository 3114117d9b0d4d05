"""examples/monitoring: the Grafana dashboard uses only series mini-sglang exports, and the
Prometheus and compose files parse."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from mini_sglang.managers.tokenizer_metrics import ServerMetrics

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _exported() -> set[str]:
    """Every sample name in the server's /metrics text (one DP replica, no state yet)."""
    text = ServerMetrics("m").render([{}]).decode()
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_grafana_dashboard_uses_only_exported_series() -> None:
    dash = json.loads((EXAMPLE / "grafana" / "dashboards" / "mini-sglang.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    used = {name for e in exprs for name in re.findall(r"sglang:[A-Za-z0-9_]+", e)}
    assert len(used) >= 10
    exported = _exported()
    missing = sorted(used - exported)
    assert not missing, f"the dashboard uses series mini-sglang does not export: {missing}"
    # Histogram panels read the _bucket series, never a bare histogram name.
    for name in used:
        if name.endswith(_HISTOGRAM_SUFFIXES):
            assert name in exported


def test_grafana_dashboard_panels_have_unique_ids_and_queries() -> None:
    dash = json.loads((EXAMPLE / "grafana" / "dashboards" / "mini-sglang.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["targets"] for p in dash["panels"])


def test_prometheus_and_compose_files_parse() -> None:
    prom = yaml.safe_load((EXAMPLE / "prometheus.yaml").read_text())
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["host.docker.internal:30000"]
    compose = yaml.safe_load((EXAMPLE / "docker-compose.yaml").read_text())
    assert set(compose["services"]) == {"prometheus", "grafana"}
    grafana_volumes = compose["services"]["grafana"]["volumes"]
    for volume in grafana_volumes:
        assert (EXAMPLE / volume.split(":")[0]).exists()
