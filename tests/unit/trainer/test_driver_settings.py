"""The step driver's view of a job spec and of the process config; version 0's hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.job.spec import job_spec, model_dir_digest, weights_digest
from rollart.runtime.config import ConfigError, load_config
from rollart.v1 import common_pb2, trainer_pb2
from rollart_trainer.config import TrainerConfig
from rollart_trainer.driver import JobError, Settings

KEY = {"ROLLART_JOB_TOKEN": "t", "ROLLART_JOB_KEY": "k"}


def cfg(**env: str) -> TrainerConfig:
    return load_config(TrainerConfig, environ={**KEY, "ROLLART_JOB_ID": "j", **env})


def spec(**kw) -> trainer_pb2.TrainerJobSpec:
    # A hub-style name: not checked for a local directory.
    d = {"job_id": "j", "model": "org/model", "batch_size": 16, "group_size": 8, "endpoints": {"ledger": "h:1"}}
    d.update(kw)
    return job_spec(d)


def test_mode_constraints():
    s = Settings.from_spec(spec(), cfg())
    assert s.mode == trainer_pb2.STEP_MODE_ASYNC and s.admission == common_pb2.ADMISSION_POLICY_BOUNDED
    assert s.groups_per_step == 2 and s.weight_sync == trainer_pb2.WEIGHT_SYNC_MODE_DELTA
    sync = Settings.from_spec(spec(mode="sync", alpha=3), cfg())
    assert sync.alpha == 0  # synchronous: nothing older than the version trained on
    one = Settings.from_spec(spec(mode="one_off", alpha=4, admission="strict"), cfg())
    assert one.alpha == 1 and one.admission == common_pb2.ADMISSION_POLICY_BOUNDED
    assert Settings.from_spec(spec(alpha=4), cfg()).alpha == 4
    areal = Settings.from_spec(spec(mode="areal", alpha=2, admission="bounded"), cfg())
    assert areal.mode == trainer_pb2.STEP_MODE_AREAL and areal.alpha == 2
    assert areal.admission == common_pb2.ADMISSION_POLICY_AT_START  # AReaL: bounded at trajectory start only
    assert Settings.from_spec(spec(batch_timeout=30), cfg()).batch_timeout == 30.0


@pytest.mark.parametrize(
    "kw, code",
    [
        ({"job_id": "other"}, "FAILED_PRECONDITION"),
        ({"model": ""}, "INVALID_ARGUMENT"),
        ({"batch_size": 12}, "INVALID_ARGUMENT"),
        ({"group_size": 0}, "INVALID_ARGUMENT"),
        ({"publish": {"weight_sync": "full_checkpoint"}}, "INVALID_ARGUMENT"),
        ({"endpoints": {}}, "INVALID_ARGUMENT"),
        ({"model": "/nonexistent/model"}, "INVALID_ARGUMENT"),
    ],
)
def test_bad_specs(kw, code):
    with pytest.raises(JobError) as exc:
        Settings.from_spec(spec(**kw), cfg())
    assert exc.value.code == code


def test_config_needs_the_segment_key(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="job_key is required"):
        load_config(TrainerConfig, environ={"ROLLART_JOB_TOKEN": "t"})
    with pytest.raises(ConfigError, match="ledger"):
        cfg(ROLLART_LEDGER="no-port")
    monkeypatch.setenv("ROLLART_STATE_DIR", str(tmp_path))
    assert load_config(TrainerConfig, environ=KEY).work_dir == tmp_path / "trainer"
    assert cfg(ROLLART_RELAYS='["127.0.0.1:5"]').relays == ["127.0.0.1:5"]


def test_version0_hash_is_the_checkpoint_digest(tiny_model: Path):
    """The trainer's h(v0) (digest of its bf16 export) equals the digest of the checkpoint files the actors
    load, so an actor configured with it reports the trainer's hash from the start."""
    from rollart_trainer.policy import Policy

    ws = Policy.load(tiny_model).weight_set(0)
    assert weights_digest(ws.arrays, ws.dtypes) == model_dir_digest(tiny_model)


def test_ledger_allocation_option_is_proportional_or_uniform():
    assert not Settings.from_spec(spec(), cfg()).uniform_allocation
    assert Settings.from_spec(spec(options={"ledger.allocation": "uniform"}), cfg()).uniform_allocation
    with pytest.raises(JobError, match=r"options\[ledger.allocation\] is 'even'"):
        Settings.from_spec(spec(options={"ledger.allocation": "even"}), cfg())


def test_ledger_options_are_checked_at_start_job_naming_the_key():
    ok = {"ledger.max_lease_attempts": "3", "ledger.lease_ttl_multiplier": "1.5", "ledger.actor_timeout": "20"}
    Settings.from_spec(spec(options=ok), cfg())
    Settings.from_spec(spec(options={"grpo.temperature": "0.7"}), cfg())  # not the ledger's: checked elsewhere
    for options, message in (
        ({"ledger.max_lease_atempts": "3"}, r"options\[ledger.max_lease_atempts\] is not a ledger option"),
        ({"ledger.max_lease_attempts": "1.5"}, r"is '1.5': a positive integer"),
        ({"ledger.buffer_capacity": "-4"}, r"is '-4': a positive integer"),
        ({"ledger.initial_lease_ttl": "soon"}, r"options\[ledger.initial_lease_ttl\] is 'soon': a positive number"),
        ({"ledger.lease_ttl_multiplier": "nan"}, r"a positive number"),
        ({"ledger.max_lease_ttl": "inf"}, r"a positive number"),
    ):
        with pytest.raises(JobError, match=message):
            Settings.from_spec(spec(options=options), cfg())
