"""rollart.runtime.entry: the one console entry point of the services."""

from __future__ import annotations

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
