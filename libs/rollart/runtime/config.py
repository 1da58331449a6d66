"""Service configuration: a YAML file plus ROLLART_* environment overrides, validated with pydantic.

Precedence (last wins): model defaults, the YAML file (``--config PATH`` or ``ROLLART_CONFIG``), environment
variables. ``ROLLART_TLS__CERT_FILE=/x`` sets ``tls.cert_file``; ``ROLLART_FOO='[a, b]'`` is a list; other values
are strings that pydantic converts to the key's type. Errors name the bad key and where it came from, e.g.
``config key 'tls.cert_file' (from env ROLLART_TLS__CERT_FILE): file does not exist``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from . import ids

ENV_PREFIX = "ROLLART_"
# Environment variables with the prefix that are not configuration keys.
_RESERVED_ENV = {"ROLLART_CONFIG", "ROLLART_STATE_DIR"}


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the key."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _check_address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT (port 0 picks a free one), got {value!r}")
    return value


class TLSConfig(StrictModel):
    """Server TLS (and mTLS when ``client_ca_file`` is set); clients use ``ca_file`` and the client pair."""

    cert_file: Path | None = None
    key_file: Path | None = None
    # CA that signed the servers' certificates (client side).
    ca_file: Path | None = None
    # CA that client certificates must chain to; setting it turns on mTLS on the server.
    client_ca_file: Path | None = None
    # Client certificate for mTLS (client side).
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    # Name to verify in the server certificate instead of the dialled host.
    server_name: str | None = None

    @field_validator("cert_file", "key_file", "ca_file", "client_ca_file", "client_cert_file", "client_key_file")
    @classmethod
    def _exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file does not exist: {value}")
        return value

    @model_validator(mode="after")
    def _pairs(self) -> "TLSConfig":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file must be set together")
        return self


class TracingConfig(StrictModel):
    # none: no spans built (a caller's trace context and baggage pass through unchanged); file: JSON lines to
    # `file`; console: stderr; otlp: OTLP/gRPC to `endpoint` (needs the rollart[otlp] extra).
    exporter: Literal["none", "file", "console", "otlp"] = "none"
    file: Path | None = None
    endpoint: str | None = None
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _needs(self) -> "TracingConfig":
        if self.exporter == "file" and self.file is None:
            raise ValueError("exporter 'file' needs tracing.file")
        if self.exporter == "otlp" and not self.endpoint:
            raise ValueError("exporter 'otlp' needs tracing.endpoint")
        return self


class ServiceConfig(StrictModel):
    """Keys every RollArt service understands; each service subclasses it with its own."""

    # gRPC listen address; port 0 picks a free port (the bound one is written to ready_file).
    listen: str = "127.0.0.1:50050"
    # Prometheus /metrics listen address; None disables the endpoint. The endpoint is unauthenticated: it binds
    # to loopback unless set otherwise (e.g. 0.0.0.0:9100 behind a firewall, see deploy/README.md#metrics).
    metrics_listen: str | None = "127.0.0.1:0"
    # Bearer token every RPC must carry (except health). Required unless auth is explicitly disabled.
    job_token: SecretStr | None = None
    job_token_file: Path | None = None
    # Only for local experiments: accept unauthenticated RPCs.
    insecure_disable_auth: bool = False
    tls: TLSConfig | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    tracing: TracingConfig = TracingConfig()
    # Address of the resource manager, for discovery and registration.
    resource_manager: str | None = None
    # Seconds to drain in-flight calls on SIGTERM before cancelling them.
    grace_seconds: float = Field(10.0, ge=0)
    # Written once the server is serving: JSON with the bound addresses (used by `rollart up` and tests).
    ready_file: Path | None = None
    # Name reported in logs, metrics and traces (defaults to the service's name).
    instance_name: str | None = None
    # Where other services dial this one (what it registers with the resource manager): HOST:PORT, or HOST to
    # keep the bound port. Default: the listen address, an unspecified host (0.0.0.0, ::) replaced by this
    # machine's address (rollart.runtime.server.advertised_address). Set it where that is not what peers
    # reach, e.g. a compose service name (which the TLS certificate names) instead of the container's IP.
    advertise: str | None = None
    # Largest request (bytes) the gRPC server accepts; None: the service's own default, sized to its largest
    # legitimate request (see the service's doc). Larger requests get RESOURCE_EXHAUSTED before they are read.
    max_receive_message_bytes: int | None = Field(None, ge=64 * 1024, le=1024 * 1024 * 1024)

    @field_validator("listen", "resource_manager")
    @classmethod
    def _addr(cls, value: str | None) -> str | None:
        return None if value is None else _check_address(value)

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        host, sep, port = value.rpartition(":")
        if not (sep and port.isdigit() and not host.endswith(":")):  # HOST only ("fe80::1" is a host too)
            host, port = value, ""
        if port == "0" or any(c in value for c in " /") or host.strip("[]") in ("0.0.0.0", "::", ""):
            raise ValueError(f"expected a host peers can dial (HOST or HOST:PORT), got {value!r}")
        return _check_address(value) if port else value

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_addr(cls, value: str | None) -> str | None:
        return None if value in (None, "", "none") else _check_address(value)

    @field_validator("job_token_file")
    @classmethod
    def _token_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file does not exist: {value}")
        return value

    @model_validator(mode="after")
    def _auth(self) -> "ServiceConfig":
        if self.token() is None and not self.insecure_disable_auth:
            raise ValueError(
                "job_token is required (set job_token, job_token_file, ROLLART_JOB_TOKEN or "
                "ROLLART_JOB_TOKEN_FILE; or insecure_disable_auth: true for local experiments)"
            )
        return self

    def token(self) -> str | None:
        if self.job_token is not None:
            return self.job_token.get_secret_value()
        if self.job_token_file is not None:
            return self.job_token_file.read_text().strip() or None
        return None


MIB = 1024 * 1024


def receive_limit(default_mib: int) -> Any:
    """The ``max_receive_message_bytes`` field of a service whose largest legitimate request needs
    ``default_mib`` MiB (the runtime's default is 4 MiB); still overridable by configuration."""
    return Field(default_mib * MIB, ge=64 * 1024, le=1024 * MIB)


JOB_ID_RE = ids.NAME_RE  # a job id is a name: it becomes a path segment and a segment-key label


class WeightPlaneConfig(ServiceConfig):
    """Keys of the services on the weight plane (trainer, relays, actors): the job whose deltas they exchange,
    and its segment key (HMAC of every delta segment and transport handshake; never the bearer token)."""

    # Whether the service refuses to start without a segment key (an actor can run without weight updates).
    require_job_key: ClassVar[bool] = True

    job_id: str = "default"
    job_key: SecretStr | None = None
    job_key_file: Path | None = None

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str) -> str:
        why = ids.name_problem(value)
        if why:
            raise ValueError(f"job_id {why}")
        return value

    @field_validator("job_key_file")
    @classmethod
    def _job_key_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file does not exist: {value}")
        return value

    @model_validator(mode="after")
    def _job_key_present(self) -> "WeightPlaneConfig":
        if self.require_job_key and self.key() is None:
            raise ValueError("job_key is required (set job_key, job_key_file, ROLLART_JOB_KEY or ROLLART_JOB_KEY_FILE)")
        return self

    def key(self) -> bytes | None:
        """The segment key as raw bytes (a key file's surrounding whitespace removed, as in the CLI)."""
        if self.job_key is not None:
            return self.job_key.get_secret_value().encode("utf-8") or None
        if self.job_key_file is not None:
            return self.job_key_file.read_bytes().strip() or None
        return None


C = TypeVar("C", bound=BaseModel)


def _env_overrides(model: type[BaseModel], environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Nested dict of overrides from ROLLART_* variables, plus key -> variable name for error messages."""
    top = {name.upper(): name for name in model.model_fields}
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX) or var in _RESERVED_ENV:
            continue
        parts = var[len(ENV_PREFIX) :].split("__")
        if parts[0] not in top:
            continue  # meant for another service or tool
        path = [top[parts[0]]] + [p.lower() for p in parts[1:]]
        # Lists and mappings are YAML; scalars stay strings and pydantic converts them to the field's type, so a
        # numeric-looking token stays a string. An empty value means "unset" (None).
        value: Any = raw
        if raw == "":
            value = None
        elif raw.lstrip()[:1] in ("[", "{"):
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                value = raw
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config key {'.'.join(path)!r} (from env {var}) conflicts with a scalar")
        node[path[-1]] = value
        origin[".".join(path)] = var
    return out, origin


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def load_config(
    model: type[C],
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> C:
    """Build a validated ``model`` from a YAML file, the environment and explicit overrides."""
    environ = os.environ if environ is None else environ
    path = path or environ.get("ROLLART_CONFIG") or None
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = loaded
        source = str(p)
    env, origin = _env_overrides(model, environ)
    data = _merge(data, env)
    if overrides:
        data = _merge(data, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            where = f"env {origin[key]}" if key in origin else source
            msg = " ".join(str(err["msg"]).removeprefix("Value error, ").split())
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            # A check across keys (no single key) names its settings itself.
            problems.append(f"config key {key!r} (from {where}): {msg}" if key else msg)
        # One line (a container log shows it as one record): each problem names its key and where it came from.
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
