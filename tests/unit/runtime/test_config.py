"""Configuration: YAML plus ROLLART_* overrides, validated, with errors that name the bad key."""

from __future__ import annotations

import pytest

from rollart.runtime.config import ConfigError, ServiceConfig, load_config


def test_yaml_then_env_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("listen: 0.0.0.0:7000\njob_token: from-file\ntracing:\n  exporter: none\ngrace_seconds: 3\n")
    trace_file = tmp_path / "t.jsonl"
    cfg = load_config(
        ServiceConfig,
        cfg_file,
        environ={
            "ROLLART_GRACE_SECONDS": "2.5",
            "ROLLART_TRACING__EXPORTER": "file",
            "ROLLART_TRACING__FILE": str(trace_file),
            "ROLLART_SOMETHING_ELSE": "ignored: another tool's variable",
            "ROLLART_CONFIG": "also ignored here",
        },
    )
    assert cfg.listen == "0.0.0.0:7000"
    assert cfg.grace_seconds == 2.5
    assert cfg.tracing.exporter == "file" and cfg.tracing.file == trace_file
    assert cfg.token() == "from-file"


def test_token_file_and_secret_is_not_printed(tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    cfg = load_config(ServiceConfig, environ={"ROLLART_JOB_TOKEN_FILE": str(tok)})
    assert cfg.token() == "s3cret"
    cfg2 = load_config(ServiceConfig, environ={"ROLLART_JOB_TOKEN": "s3cret"})
    assert "s3cret" not in repr(cfg2) and cfg2.token() == "s3cret"


@pytest.mark.parametrize(
    "yaml_text, environ, key, origin",
    [
        ("job_token: t\nlisten: nonsense\n", {}, "'listen'", "c.yaml"),
        ("job_token: t\n", {"ROLLART_LISTEN": "host:99999"}, "'listen'", "env ROLLART_LISTEN"),
        ("job_token: t\ngrace_seconds: -1\n", {}, "'grace_seconds'", "c.yaml"),
        ("job_token: t\nlog_level: LOUD\n", {}, "'log_level'", "c.yaml"),
        ("job_token: t\nlistn: 1.2.3.4:5\n", {}, "'listn'", "unknown key"),
        ("job_token: t\ntracing:\n  exporter: file\n", {}, "'tracing'", "tracing.file"),
        (
            "job_token: t\n",
            {"ROLLART_TLS__CERT_FILE": "/does/not/exist"},
            "'tls.cert_file'",
            "env ROLLART_TLS__CERT_FILE",
        ),
        ("{}\n", {}, "job_token is required", "ROLLART_JOB_TOKEN"),
    ],
)
def test_errors_name_the_bad_key_and_its_source(tmp_path, yaml_text, environ, key, origin):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_config(ServiceConfig, cfg_file, environ=environ)
    assert key in str(exc.value) and origin in str(exc.value)


def test_bad_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(ServiceConfig, tmp_path / "missing.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(ServiceConfig, bad, environ={})
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(ServiceConfig, scalar, environ={})


def test_auth_can_only_be_disabled_explicitly():
    cfg = load_config(ServiceConfig, environ={"ROLLART_INSECURE_DISABLE_AUTH": "true"})
    assert cfg.insecure_disable_auth and cfg.token() is None


def test_numeric_looking_token_stays_a_string_and_lists_parse():
    cfg = load_config(ServiceConfig, environ={"ROLLART_JOB_TOKEN": "0123456789", "ROLLART_GRACE_SECONDS": "1e-3"})
    assert cfg.token() == "0123456789" and cfg.grace_seconds == 0.001
