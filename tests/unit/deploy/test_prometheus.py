"""Prometheus and Grafana files: `promtool check config` / `check rules` pass on the compose configuration, the
recording rules and the configuration generated for a local cluster (file-based discovery from its state); every
dashboard panel queries metrics the code exports or rules record; the compose profile is wired."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rollart.job import monitoring

ROOT = Path(__file__).resolve().parents[3]
PROM = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "rollart-dashboard.json"

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(promtool is None, reason="promtool missing (apt-get install prometheus; make setup)")


def _check(*args: str) -> str:
    assert promtool is not None
    out = subprocess.run([promtool, "check", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@needs_promtool
def test_recording_rules_pass_promtool():
    assert "SUCCESS" in _check("rules", str(PROM / "rules.yml"))


@needs_promtool
def test_compose_configuration_passes_promtool():
    _check("config", str(PROM / "prometheus-compose.yml"))


def _state(tmp: Path) -> dict:
    return {
        "state_dir": str(tmp),
        "services": {
            "ledger": {"address": "127.0.0.1:1", "metrics_port": 41001},
            "actor": {"address": "127.0.0.1:2", "metrics_port": 41002},
            "actor-2": {"address": "127.0.0.1:3", "metrics_port": 41003},
            "envmanager-2": {"address": "127.0.0.1:4", "metrics_port": 41004},
            "no-metrics": {"address": "127.0.0.1:5", "metrics_port": None},
        },
        "mooncake": {"address": "127.0.0.1:6", "metrics_port": 41006},
    }


@needs_promtool
def test_generated_local_configuration_passes_promtool(tmp_path: Path):
    (tmp_path / "state.json").write_text(json.dumps(_state(tmp_path)))
    targets = monitoring.write_targets(tmp_path)
    config = monitoring.write_config(tmp_path)
    assert config.parent == targets.parent == tmp_path / "prometheus"
    assert "SUCCESS: 1 rule files found" in _check("config", str(config))
    groups = json.loads(targets.read_text())
    by_name = {g["labels"]["instance_name"]: g for g in groups}
    assert set(by_name) == {"ledger", "actor", "actor-2", "envmanager-2", "mooncake"}
    assert by_name["actor-2"] == {"targets": ["127.0.0.1:41003"], "labels": {"component": "actor", "instance_name": "actor-2"}}
    assert by_name["envmanager-2"]["labels"]["component"] == "envmanager"


def _rules() -> set[str]:
    doc = yaml.safe_load((PROM / "rules.yml").read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"]}


def _exported() -> set[str]:
    """Metric names the code registers with prometheus_client (as Prometheus sees them)."""
    names: set[str] = set()
    pattern = re.compile(r"(Counter|Gauge|Histogram)\(\s*\"(rollart_[a-z0-9_]+)\"", re.S)
    for root in (ROOT / "libs" / "rollart", ROOT / "services"):
        for path in root.rglob("*.py"):
            for kind, name in pattern.findall(path.read_text()):
                if kind == "Counter":
                    names.add(name if name.endswith("_total") else name + "_total")
                elif kind == "Histogram":
                    names.update({name + "_bucket", name + "_sum", name + "_count"})
                else:
                    names.add(name)
    return names


def _panels() -> list[dict]:
    return monitoring.dashboard_panels(DASHBOARD)


def dashboard_expressions() -> list[tuple[str, str]]:
    return monitoring.dashboard_queries(DASHBOARD)


def test_dashboard_queries_name_only_exported_metrics_or_recorded_rules():
    exported, rules = _exported(), _rules()
    assert {"rollart_rpc_total", "rollart_llmproxy_outstanding_requests", "rollart_envmanager_loops"} <= exported
    titles = [p["title"] for p in _panels()]
    assert len(titles) == len(set(titles)) >= 12
    for title, expr in dashboard_expressions():
        for name in re.findall(r"\b(rollart[:_][a-z0-9_:]+)", expr):
            assert name in exported or name in rules, f"{title}: {name} is neither exported nor recorded"
    # Every recording rule is drawn somewhere, and the rules only read exported metrics.
    used = " ".join(e for _, e in dashboard_expressions())
    assert not [r for r in rules if r not in used]
    for g in yaml.safe_load((PROM / "rules.yml").read_text())["groups"]:
        for r in g["rules"]:
            for name in re.findall(r"\b(rollart_[a-z0-9_]+)", r["expr"]):
                assert name in exported, f"{r['record']}: {name} is not exported"


def test_dashboard_covers_the_cluster():
    titles = " ".join(p["title"].lower() for p in _panels())
    for topic in ("rollout", "actor", "queue", "latency", "lease", "settle", "weight", "loops", "error"):
        assert topic in titles, topic
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and all(p["datasource"]["uid"] == "${datasource}" for p in _panels())


def test_compose_profile_runs_prometheus_with_the_rules():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prom = compose["services"]["prometheus"]
    assert prom["profiles"] == ["monitoring"]
    assert (ROOT / prom["build"]["context"] / "Dockerfile").is_file()
    dockerfile = (PROM / "Dockerfile").read_text()
    assert "apt-get install" in dockerfile and "prometheus" in dockerfile and "rules.yml" in dockerfile
    override = yaml.safe_load((ROOT / "docker-compose.override.yml").read_text())
    assert override["services"]["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
    scraped = yaml.safe_load((PROM / "prometheus-compose.yml").read_text())
    hosts = {t.split(":")[0] for sc in scraped["scrape_configs"] for g in sc["static_configs"] for t in g["targets"]}
    services = {n for n, s in compose["services"].items() if n not in ("redis", "model", "prometheus")}
    assert hosts == services


@needs_promtool
def test_actor_weight_version_behind_rule_counts_versions_behind_the_newest(tmp_path: Path):
    """promtool evaluates the recording rule on two actors (v5 and v3, then both v6): against the ledger's newest
    version (6, then 7) they are 1 and 3 behind, then 1 and 1; with no ledger scraped, against the newest an actor
    serves: 0 and 2, then 0 and 0."""
    shutil.copyfile(PROM / "rules.yml", tmp_path / "rules.yml")
    series = '{__name__="rollart_actor_weight_version", component="actor", instance_name="%s"}'
    actors = [{"series": series % "actor", "values": "5 5 6"}, {"series": series % "actor-2", "values": "3 3 6"}]
    ledger = {"series": '{__name__="rollart_ledger_latest_version", instance_name="ledger"}', "values": "6 6 7"}

    def case(inputs: list, at1: tuple[int, int], at2: tuple[int, int]) -> dict:
        def samples(behind: tuple[int, int]) -> list:
            return [{"labels": f'rollart:actor_weight_version:behind{{instance_name="{a}"}}', "value": b}
                    for a, b in zip(("actor", "actor-2"), behind)]
        return {"interval": "1m", "input_series": inputs, "promql_expr_test": [
            {"expr": "rollart:actor_weight_version:behind", "eval_time": "1m", "exp_samples": samples(at1)},
            {"expr": "rollart:actor_weight_version:behind", "eval_time": "2m", "exp_samples": samples(at2)},
        ]}  # fmt: skip

    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [case([*actors, ledger], (1, 3), (1, 1)), case(actors, (0, 2), (0, 0))],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec))
    assert promtool is not None
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr
