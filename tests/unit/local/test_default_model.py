"""`rollart up` without ROLLART_MODEL: the tiny test model is built by the developer tooling before the actor
starts (the actor only ever receives a path), once, whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart.local import cluster
from rollart.local.processes import ProcessError

ACTOR = next(s for s in cluster.SERVICES if s.name == "actor")


def _state(tmp_path: Path) -> dict:
    return {"state_dir": str(tmp_path), "services": {}}


def test_the_actor_is_told_the_default_model_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLART_MODEL", raising=False)
    env = ACTOR.extra_env(_state(tmp_path))
    assert env["ROLLART_MODEL"] == str(tmp_path / "models" / "tiny")
    assert not any("BUILD" in k for k in env)  # no build flag: the actor has no model-building option
    monkeypatch.setenv("ROLLART_MODEL", "/models/mine")
    assert "ROLLART_MODEL" not in ACTOR.extra_env(_state(tmp_path))  # inherited as is


def test_another_model_is_never_built(tmp_path: Path) -> None:
    logs: list[str] = []
    ACTOR.prepare(_state(tmp_path), {"ROLLART_MODEL": str(tmp_path / "elsewhere")}, logs.append)
    assert logs == [] and not (tmp_path / "models").exists()


def test_without_the_tooling_the_error_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "find_script", lambda name: None)
    env = {"ROLLART_MODEL": str(tmp_path / "models" / "tiny")}
    with pytest.raises(ProcessError, match="ROLLART_MODEL.*rollart-devtools"):
        ACTOR.prepare(_state(tmp_path), env, lambda _m: None)


@pytest.mark.timeout(300)
def test_the_tiny_model_is_built_once_by_rollart_devtools(tmp_path: Path) -> None:
    if cluster.find_script("rollart-devtools") is None:
        pytest.skip("rollart-devtools is not installed (make setup installs tools/)")
    out = tmp_path / "models" / "tiny"
    env = {"ROLLART_MODEL": str(out)}
    logs: list[str] = []
    ACTOR.prepare(_state(tmp_path), env, logs.append)
    assert len(logs) == 1 and "building the tiny test model" in logs[0]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not out.with_name("tiny.partial").exists()
    # The actor's former built-in default: seed 0, random weights, the builder's default shape.
    spec = json.loads((out / "rollart_tiny.json").read_text())["spec"]
    assert (spec["seed"], spec["pretrain_steps"], spec["layers"], spec["hidden"]) == (0, 0, 4, 256)
    before = (out / "model.safetensors").stat().st_mtime_ns
    ACTOR.prepare(_state(tmp_path), env, logs.append)  # there already: not built again
    assert len(logs) == 1 and (out / "model.safetensors").stat().st_mtime_ns == before
