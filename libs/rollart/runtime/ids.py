"""The identifier rules every RollArt service checks, defined once, and the one way to mint an id.

``ID`` (worker, trajectory, request, lease-holder, group and loop ids): 1-256 of ``A-Za-z0-9._:@/#+=~-``,
starting with a letter or digit, so an id can always be logged, sent as a header and compared byte for byte.
``NAME`` (pools, roles, bindings, jobs): 1-63 of ``a-z0-9._-``, DNS-label-like, because names become path
segments, metric labels and Kubernetes labels; every name is an id. Checks raise ``errors.InvalidArgument``
naming the field; :func:`new_id` (``traj-3f9c...``) always returns a valid ``ID``. docs/security.md.
"""

from __future__ import annotations

import re
import secrets

from . import errors

MAX_ID_CHARS = 256
ID_CHARS = "A-Z a-z 0-9 . _ : @ / # + = ~ -"
ID_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:@/#+=~-]{{0,{MAX_ID_CHARS - 1}}}$")

MAX_NAME_CHARS = 63
NAME_CHARS = "a-z 0-9 . _ -"
NAME_RE = re.compile(rf"^[a-z0-9][a-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}$")

ID_RULE = f"1-{MAX_ID_CHARS} characters of {ID_CHARS}, starting with a letter or digit"
NAME_RULE = f"1-{MAX_NAME_CHARS} characters of {NAME_CHARS}, starting with a letter or digit"


def is_id(value: object) -> bool:
    return isinstance(value, str) and ID_RE.match(value) is not None


def is_name(value: object) -> bool:
    return isinstance(value, str) and NAME_RE.match(value) is not None


def id_problem(value: str, *, max_chars: int = MAX_ID_CHARS) -> str | None:
    """Why ``value`` is not an id (a phrase to follow the field name), or ``None`` if it is one."""
    if not is_id(value) or len(value) > max_chars:
        rule = ID_RULE if max_chars == MAX_ID_CHARS else ID_RULE.replace(str(MAX_ID_CHARS), str(max_chars), 1)
        return f"must be {rule}, got {errors.shorten(value)}"
    return None


def name_problem(value: str) -> str | None:
    """Why ``value`` is not a name, or ``None`` if it is one."""
    if not is_name(value):
        return f"must be {NAME_RULE}, got {errors.shorten(value)}"
    return None


def optional_name(field: str, value: str) -> str:
    """``value`` if it is empty or a name; else ``ValueError`` naming ``field`` (for config validators)."""
    why = name_problem(value) if value else None
    if why:
        raise ValueError(f"{field} {why}")
    return value


def check_id(field: str, value: str, *, required: bool = True, max_chars: int = MAX_ID_CHARS) -> str:
    """``value`` if it is an id; else ``errors.InvalidArgument(field, ...)``. Empty is allowed unless required.

    ``max_chars`` lowers the length limit where an id is composed into a longer one (e.g. a holder prefix).
    """
    if not value:
        if required:
            raise errors.InvalidArgument(field, "is required")
        return value
    why = id_problem(value, max_chars=max_chars)
    if why:
        raise errors.InvalidArgument(field, why)
    return value


def check_name(field: str, value: str, *, required: bool = True) -> str:
    """``value`` if it is a name; else ``errors.InvalidArgument(field, ...)``. Empty is allowed unless required."""
    if not value:
        if required:
            raise errors.InvalidArgument(field, "is required")
        return value
    why = name_problem(value)
    if why:
        raise errors.InvalidArgument(field, why)
    return value


#: Random bytes of a minted id (hex-encoded: twice as many characters); 96 bits never collide in practice.
NEW_ID_BYTES = 12


def new_id(prefix: str, *, nbytes: int = NEW_ID_BYTES) -> str:
    """A fresh id ``<prefix>-<2*nbytes hex digits>`` (``new_id("traj")`` -> ``"traj-5c0f..."``).

    ``prefix`` names what the id identifies and may itself be an id (``"job7-v3"``); the result is always a
    valid id, so a minted id passes every check a caller-chosen one does.
    """
    if nbytes < 4:
        raise ValueError(f"new_id needs at least 4 random bytes, got {nbytes}")
    value = f"{prefix}-{secrets.token_hex(nbytes)}" if prefix else secrets.token_hex(nbytes)
    if not is_id(value):
        raise ValueError(f"prefix {prefix!r} does not make an id ({ID_RULE})")
    return value
