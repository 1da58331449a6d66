"""Option parsing: options arrive as strings (proto maps, CLI) or typed values (YAML, Python)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import EnvConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def opt_str(options: Mapping[str, Any], name: str, default: str) -> str:
    value = options.get(name, default)
    return str(value)


def opt_int(options: Mapping[str, Any], name: str, default: int, *, minimum: int | None = None) -> int:
    raw = options.get(name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise EnvConfigError(f"option {name!r} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvConfigError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def opt_float(options: Mapping[str, Any], name: str, default: float) -> float:
    raw = options.get(name, default)
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise EnvConfigError(f"option {name!r} must be a number, got {raw!r}") from None


def opt_bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    raw = options.get(name, default)
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise EnvConfigError(f"option {name!r} must be a boolean, got {raw!r}")


def opt_choice(options: Mapping[str, Any], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = str(options.get(name, default))
    if value not in choices:
        raise EnvConfigError(f"option {name!r} must be one of {', '.join(choices)}, got {value!r}")
    return value
