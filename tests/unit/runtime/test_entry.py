"""rollart.runtime.entry: the one console entry point of the services."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rollart.runtime import entry
from rollart.runtime.config import ServiceConfig


class _Cfg(ServiceConfig):
    workers: int = 1


class _Svc:
    name = "svc"
    service_names: list[str] = []

    def __init__(self, cfg: _Cfg) -> None:
        if cfg.workers > 10:
            raise ValueError("workers must be at most 10")
        self.cfg = cfg


@pytest.fixture
def served(monkeypatch):
    got: list = []
    monkeypatch.setattr(entry, "run_service", lambda svc, cfg: got.append((svc, cfg)))
    for var in ("ROLLART_CONFIG", "ROLLART_WORKERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ROLLART_JOB_TOKEN", "t" * 32)
    return got


def test_loads_the_config_and_serves_the_service(served, tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("workers: 3\n")
    entry.main("rollart-x", _Cfg, _Svc, ["--config", str(path)])
    (svc, cfg), = served
    assert isinstance(svc, _Svc) and cfg.workers == 3
    monkeypatch.setenv("ROLLART_WORKERS", "4")  # the environment overrides the file
    entry.main("rollart-x", _Cfg, _Svc, ["--config", str(path)])
    assert served[-1][1].workers == 4


def test_a_service_named_by_import_path_is_imported_after_the_config_checks(served):
    entry.main("rollart-x", _Cfg, f"{__name__}:_Svc", [])
    assert isinstance(served[0][0], _Svc)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p, mp: ["--config", str(p / "missing.yaml")], "rollart-x: config file not found"),
        (lambda p, mp: mp.setenv("ROLLART_WORKERS", "many") or [], "rollart-x: config key 'workers'"),
        (lambda p, mp: mp.setenv("ROLLART_WORKERS", "11") or [], "rollart-x: workers must be at most 10"),
    ],
)
def test_bad_config_exits_with_the_reason(served, tmp_path, monkeypatch, capsys, setup, message):
    with pytest.raises(SystemExit) as info:
        entry.main("rollart-x", _Cfg, _Svc, setup(tmp_path, monkeypatch))
    text = str(info.value.code)
    assert text.startswith("rollart-x: ") and message.removeprefix("rollart-x: ") in text
    assert not served


def test_a_service_console_script_reports_a_bad_config(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rollart_relay", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.strip().startswith("rollart-relay: config file not found")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("env", "config", "needles"),
    [
        # A check across keys: the message names its settings itself, with no "(top level)" or pydantic prefix.
        ({"ROLLART_JOB_TOKEN": ""}, None, ["job_token is required", "ROLLART_JOB_TOKEN"]),
        # Two bad keys: both on the one line.
        (
            {"ROLLART_TLS__CERT_FILE": "/nonexistent.crt", "ROLLART_LISTEN": "nowhere"},
            None,
            ["config key 'listen' (from env ROLLART_LISTEN)", "config key 'tls.cert_file'"],
        ),
        # YAML's own error spans several lines.
        ({}, "listen: [unclosed\n  - x: {\n", ["is not valid YAML", "line"]),
    ],
)
def test_a_config_error_is_one_line_without_a_traceback(tmp_path, env, config, needles):
    """What a container log shows for bad settings: exactly one line, naming them."""
    argv = [sys.executable, "-m", "rollart_relay"]
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        argv += ["--config", str(tmp_path / "c.yaml")]
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    base.update(ROLLART_JOB_TOKEN="t" * 32, ROLLART_JOB_KEY="k" * 64)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**base, **env})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith("rollart-relay: ") and all(n in lines[0] for n in needles), lines[0]
    assert "Value error" not in lines[0] and "(top level)" not in lines[0]
