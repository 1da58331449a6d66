"""Prometheus for a local cluster (``rollart up --with-prometheus``, ``rollart run`` with ``tracking.prometheus``).

Every service of a local cluster serves /metrics on a port it picked at start (``state.json``); a restarted
service keeps its port. :func:`write_targets` turns the state into Prometheus file-based service discovery
(``<state dir>/prometheus/targets.json``: one target per service, labelled ``component`` and ``instance_name``),
:func:`write_config` the configuration next to it (the recording rules of ``deploy/prometheus/rules.yml``
copied beside it), :func:`start` runs ``prometheus`` (the Debian package) on a free loopback port and records
it in ``<state dir>/prometheus/prometheus.json``; :func:`stop` ends it. See docs/tracking.md.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from rollart.local import cluster as local
from rollart.local.processes import ManagedProcess, ProcessError, free_port, pid_alive, stop_pid
from rollart.local.supervisor import base_name

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "rollart-dashboard.json"
SCRAPE_INTERVAL = "5s"


def folder(state_dir: Path) -> Path:
    return state_dir / "prometheus"


def targets(state: dict[str, Any]) -> list[dict[str, Any]]:
    """File-SD target groups of a local cluster's state: each service (and the Mooncake master) by its metrics port."""
    out = []
    for name, info in sorted(state.get("services", {}).items()):
        if info.get("metrics_port"):
            # Not "service": the RPC metrics carry a label of that name (it would become exported_service).
            labels = {"component": base_name(name), "instance_name": name}
            out.append({"targets": [f"127.0.0.1:{info['metrics_port']}"], "labels": labels})
    mc = state.get("mooncake") or {}
    if mc.get("metrics_port"):
        out.append({"targets": [f"127.0.0.1:{mc['metrics_port']}"],
                    "labels": {"component": "mooncake", "instance_name": "mooncake"}})
    return out


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # Prometheus re-reads file-SD files on change: never a half-written one


def write_targets(state_dir: Path, state: dict[str, Any] | None = None) -> Path:
    st = state if state is not None else local.read_state(state_dir)
    d = folder(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "targets.json"
    _write(path, json.dumps(targets(st), indent=2) + "\n")
    return path


def write_config(state_dir: Path, scrape_interval: str = SCRAPE_INTERVAL) -> Path:
    """``<state dir>/prometheus/prometheus.yml``: scrape the targets file, evaluate the recording rules."""
    d = folder(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    rules: list[str] = []
    if RULES.is_file():
        shutil.copyfile(RULES, d / "rules.yml")
        rules = ["rules.yml"]
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": rules,
        "scrape_configs": [
            {
                "job_name": "rollart",
                "file_sd_configs": [{"files": ["targets.json"], "refresh_interval": "5s"}],
            }
        ],
    }
    path = d / "prometheus.yml"
    _write(path, json.dumps(config, indent=2) + "\n")  # JSON is YAML: no YAML writer needed
    return path


def info(state_dir: Path) -> dict[str, Any]:
    path = folder(state_dir) / "prometheus.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def start(state_dir: Path, *, port: int = 0, scrape_interval: str = SCRAPE_INTERVAL, timeout: float = 60.0) -> dict:
    """Write the targets and configuration and start Prometheus on 127.0.0.1 (``port`` 0: a free one).
    Returns ``{"pid", "url", "config", "log"}`` (also in ``prometheus.json``)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise ProcessError("prometheus is not installed (apt-get install prometheus; `make setup` does)")
    old = info(state_dir)
    if old and pid_alive(int(old["pid"])):
        raise ProcessError(f"Prometheus already runs for {state_dir} (pid {old['pid']}, {old['url']})")
    write_targets(state_dir)
    config = write_config(state_dir, scrape_interval)
    d = folder(state_dir)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={d / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=7d",
    ]
    proc = ManagedProcess("prometheus", argv, log_path=d / "prometheus.log").start()
    pid = proc.pid
    assert pid is not None
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if not pid_alive(pid):
            raise ProcessError(f"prometheus exited at start: {(d / 'prometheus.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            stop_pid(pid)
            raise ProcessError(f"prometheus not ready after {timeout:.0f}s (log: {d / 'prometheus.log'})")
        time.sleep(0.3)
    out = {"pid": pid, "url": url, "config": str(config), "log": str(d / "prometheus.log")}
    _write(d / "prometheus.json", json.dumps(out, indent=2) + "\n")
    return out


def stop(state_dir: Path) -> bool:
    """Stop the cluster's Prometheus, if one runs. True when none is left."""
    st = info(state_dir)
    if not st:
        return True
    gone = stop_pid(int(st["pid"]))
    if gone:
        (folder(state_dir) / "prometheus.json").unlink(missing_ok=True)
    return gone


def query(url: str, expr: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The result vector of an instant query (``/api/v1/query``)."""
    from urllib.parse import urlencode

    with urllib.request.urlopen(f"{url}/api/v1/query?{urlencode({'query': expr})}", timeout=timeout) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('error')}")
    return list(body["data"]["result"])


def dashboard_panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """The panels of a Grafana dashboard JSON (those inside rows included)."""
    out: list[dict[str, Any]] = []
    for p in json.loads(path.read_text())["panels"]:
        out.extend(p.get("panels", [])) if p.get("type") == "row" else out.append(p)
    return out


def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard."""
    return [(p["title"], t["expr"]) for p in dashboard_panels(path) for t in p.get("targets", [])]
