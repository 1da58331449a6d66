"""One validation layer for every RollArt servicer: ranges, lengths, formats and enum values of request fields.

Two parts:

* **Field checks** a servicer calls for its own rules: :func:`integer`, :func:`number` (refuses NaN and infinity),
  :func:`duration`, :func:`text`, :func:`ident` / :func:`name` (the id rules of ``rollart.runtime.ids``),
  :func:`items`, :func:`mapping`, :func:`enum`, and for strings that reach the file system, a URL parser or
  a model loader :func:`path`, :func:`uri` and :func:`model` (length in characters and bytes, no NUL,
  control or bidi characters, a form the parser accepts). Each returns the checked value and raises
  ``errors.InvalidArgument(field, ...)`` naming the field; a caller's value is only ever echoed shortened
  (``errors.shorten``), and the status details are bounded by ``rollart.runtime.errors``.
* **Request limits** every service gets from the server runtime before its handler runs (:class:`Limits`,
  :func:`check_limits`): every string, repeated field and map of the request, walked through the message's
  descriptor, is within a bound: ids and names (fields named ``*_id``, ``*_ids``, ``name``, ``holder``, ...) at
  most :data:`ID_CHARS`, other strings at most ``Limits.max_string_chars``, and so on. A service raises a bound
  for the few fields that legitimately carry more (prompt text, token lists) with ``Limits.fields``.

Example::

    from rollart.runtime import validation as v

    v.integer("max_workers", request.max_workers, 1, 10_000)
    lr = v.number("spec.optimizer.learning_rate", spec.optimizer.learning_rate, 0.0, 1.0, lo_open=True)
    timeout = v.duration("idle_timeout", request.idle_timeout, max_seconds=86_400)
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from . import errors, ids, timeutil

#: Longest id or name the request limits let through (the id rule's own maximum).
ID_CHARS = ids.MAX_ID_CHARS
#: Field names treated as ids or names by the request limits (besides every ``*_id`` and ``*_ids``).
ID_FIELD_NAMES = frozenset(
    {"name", "holder", "role", "pool", "region", "subscriber_id", "model", "scorer", "environment", "backend"}
)

# ------------------------------------------------------------------------------------------------ field checks


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def integer(field: str, value: int, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` if ``lo <= value <= hi`` (either bound may be None)."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else _fmt(lo)
        hi_s = "inf" if hi is None else _fmt(hi)
        raise errors.InvalidArgument(field, f"must be within [{lo_s}, {hi_s}], got {errors.shorten(value)}")
    return value


def number(
    field: str,
    value: float,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` if it is finite and within the bounds (``lo_open``/``hi_open`` exclude the bound itself)."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise errors.InvalidArgument(field, f"must be a finite number, got {errors.shorten(value)}")
    low_bad = lo is not None and (value <= lo if lo_open else value < lo)
    high_bad = hi is not None and (value >= hi if hi_open else value > hi)
    if low_bad or high_bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else _fmt(lo)
        hi_s = "inf" if hi is None else _fmt(hi)
        raise errors.InvalidArgument(field, f"must be within {left}{lo_s}, {hi_s}{right}, got {_fmt(value)}")
    return float(value)


def duration(field: str, d: Duration, *, max_seconds: float | None = None, required: bool = False) -> float:
    """Seconds of a caller's Duration: not negative, well-formed, at most ``max_seconds``; > 0 when required."""
    secs = timeutil.checked_duration(field, d, max_seconds=max_seconds)
    if required and secs <= 0:
        raise errors.InvalidArgument(field, "is required (a positive duration)")
    return secs


#: The range of a valid ``google.protobuf.Timestamp`` (0001-01-01 to 9999-12-31, UTC).
MIN_TIMESTAMP_S, MAX_TIMESTAMP_S = -62_135_596_800, 253_402_300_799


def timestamp(field: str, ts: Timestamp) -> float:
    """Seconds since the epoch of a caller's Timestamp, if protobuf's own range and nanos rule allow it."""
    if not 0 <= ts.nanos < 1_000_000_000 or not MIN_TIMESTAMP_S <= ts.seconds <= MAX_TIMESTAMP_S:
        raise errors.InvalidArgument(field, "is not a valid timestamp")
    return ts.seconds + ts.nanos / 1e9


def text(field: str, value: str, max_chars: int, *, required: bool = False) -> str:
    """``value`` if it has at most ``max_chars`` characters (and is not empty when required)."""
    if required and not value:
        raise errors.InvalidArgument(field, "is required")
    if len(value) > max_chars:
        raise errors.InvalidArgument(field, f"must be at most {max_chars} characters, got {len(value)}")
    return value


#: Longest path, URI or model reference a request may carry (characters); ``PATH_MAX`` bounds its bytes.
MAX_PATH_CHARS = 1024
PATH_MAX_BYTES = 4096
#: Longest path component (``NAME_MAX``, UTF-8 bytes).
NAME_MAX_BYTES = 255
# Control (Cc), format (Cf: bidi marks and overrides, zero-width characters), surrogate, private-use and
# line/paragraph separator characters: a path holding one is ambiguous when displayed or logged.
_BAD_PATH_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def _path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a file-system path (a phrase to follow the field name), or ``None``."""
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in _BAD_PATH_CATEGORIES:
            what = "NUL" if ch == "\0" else f"U+{ord(ch):04X}"
            return f"must not contain control, format or bidi characters ({what} at {i})"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > PATH_MAX_BYTES:
        return f"must be at most {PATH_MAX_BYTES} bytes as UTF-8, got {size}"
    for part in value.split("/"):
        if len(part.encode()) > NAME_MAX_BYTES:
            return f"has a path component over {NAME_MAX_BYTES} bytes: {errors.shorten(part, 40)}"
    return None


def path(field: str, value: str, *, max_chars: int = MAX_PATH_CHARS, required: bool = False) -> str:
    """``value`` if it can be handed to the file system as is: at most ``max_chars`` characters and
    :data:`PATH_MAX_BYTES` bytes, components of at most :data:`NAME_MAX_BYTES` bytes, no NUL, control, bidi or
    other format characters. Says nothing of whether the path exists (the caller checks what it needs)."""
    text(field, value, max_chars, required=required)
    why = _path_problem(value)
    if why:
        raise errors.InvalidArgument(field, why)
    return value


def uri(
    field: str,
    value: str,
    *,
    schemes: Sequence[str] = ("file", "s3", "gs", "http", "https"),
    max_chars: int = MAX_PATH_CHARS,
    required: bool = False,
) -> str:
    """``value`` if it is a local path (:func:`path`) or a URI with one of ``schemes`` that the URL parser
    accepts (no whitespace, control or bidi characters, a valid host part)."""
    path(field, value, max_chars=max_chars, required=required)
    if "://" not in value:
        return value
    if any(ch.isspace() for ch in value):
        raise errors.InvalidArgument(field, f"must not contain whitespace, got {errors.shorten(value)}")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - parsing the port is what may fail
    except ValueError as exc:
        raise errors.InvalidArgument(field, f"is not a valid URI ({exc}): {errors.shorten(value)}") from None
    if parts.scheme.lower() not in schemes:
        raise errors.InvalidArgument(
            field, f"must be a path or a {', '.join(s + '://' for s in schemes)} URI, got {errors.shorten(value)}"
        )
    return value


#: A Hugging Face repository name (``org/name``) or a bare model name.
HF_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def model(field: str, value: str, *, required: bool = False) -> str:
    """``value`` if it can name a model: a Hugging Face name (``org/name``) or a path (:func:`path`); whether
    it exists is for the caller (a model loader must never see a value this refuses)."""
    if value and HF_NAME_RE.match(value):
        return value
    return path(field, value, required=required)


def ident(field: str, value: str, *, required: bool = True, max_chars: int = ids.MAX_ID_CHARS) -> str:
    """``value`` if it is an id (``rollart.runtime.ids``: 1-256 of ``A-Za-z0-9._:@/#+=~-``)."""
    return ids.check_id(field, value, required=required, max_chars=max_chars)


def name(field: str, value: str, *, required: bool = True) -> str:
    """``value`` if it is a name (``rollart.runtime.ids``: 1-63 of ``a-z0-9._-``)."""
    return ids.check_name(field, value, required=required)


def items(field: str, values: Sized, max_items: int, *, min_items: int = 0) -> Sized:
    """``values`` if it holds ``min_items`` to ``max_items`` entries."""
    n = len(values)
    if not min_items <= n <= max_items:
        raise errors.InvalidArgument(field, f"must hold {min_items} to {max_items} entries, got {n}")
    return values


def mapping(
    field: str, values: Mapping[str, Any], max_entries: int, *, max_key_chars: int = 256, max_value_chars: int = 4096
) -> Mapping[str, Any]:
    """``values`` if it has at most ``max_entries`` entries, with short keys and (string) values."""
    items(field, values, max_entries)
    for key, value in values.items():
        if len(key) > max_key_chars:
            raise errors.InvalidArgument(field, f"has a key of {len(key)} characters (at most {max_key_chars})")
        if isinstance(value, str) and len(value) > max_value_chars:
            raise errors.InvalidArgument(
                f"{field}[{errors.shorten(key, 40)}]", f"must be at most {max_value_chars} characters"
            )
    return values


def enum(
    field: str,
    value: int,
    enum_type: Any,
    *,
    required: bool = True,
    allowed: Sequence[int] | None = None,
) -> int:
    """``value`` if it is a value of ``enum_type`` (a generated enum wrapper or an EnumDescriptor).

    ``required`` refuses the zero (``*_UNSPECIFIED``) value; ``allowed`` narrows the accepted values.
    """
    desc: EnumDescriptor = getattr(enum_type, "DESCRIPTOR", enum_type)
    known = {v.number: v.name for v in desc.values}
    if value not in known or (allowed is not None and value not in allowed):
        choices = [known[n] for n in (allowed if allowed is not None else known) if n != 0 and n in known]
        raise errors.InvalidArgument(field, f"must be one of {', '.join(choices)}, got {errors.shorten(value)}")
    if required and value == 0:
        choices = [n for k, n in known.items() if k != 0 and (allowed is None or k in allowed)]
        raise errors.InvalidArgument(field, f"is required (one of {', '.join(choices)})")
    return value


# ---------------------------------------------------------------------------------------------- request limits


@dataclass(frozen=True)
class Limits:
    """Bounds every request of a service is held to before its handler runs (see :func:`check_limits`).

    ``fields`` raises (or lowers) the bound of single fields, keyed by the field's full name
    (``"rollart.v1.ChatMessage.content"``): for a string its characters, for a repeated field or map its
    entries. Build variants with :func:`limits`, which keeps the bulk-text fields.
    """

    #: Characters of a string that is not an id or name.
    max_string_chars: int = 64 * 1024
    #: Entries of a repeated message field.
    max_messages: int = 10_000
    #: Entries of a repeated scalar field (token ids, log-probabilities: a long context is 10^5-10^6).
    max_scalars: int = 1_000_000
    #: Entries of a map.
    max_map_entries: int = 1_000
    #: Nesting depth of messages (recursive messages such as JSON-like values).
    max_depth: int = 32
    fields: Mapping[str, int] = field(default_factory=lambda: dict(BULK_TEXT_FIELDS))


#: Text fields that legitimately carry documents (conversations, observations, gold answers, tests, JSON
#: arguments): bounded by the service's receive limit rather than by ``max_string_chars``.
BULK_TEXT_CHARS = 64 * 1024 * 1024
BULK_TEXT_FIELDS: dict[str, int] = {
    f"rollart.v1.{name}": BULK_TEXT_CHARS
    for name in (
        "ChatMessage.content",
        "Turn.observation",
        "Turn.action",
        "ModelInput.text",
        "Prompt.text",
        "Prompt.MetadataEntry.value",
        "Trajectory.MetadataEntry.value",
        "RunEpisodeRequest.prompt_text",
        "RunEpisodeRequest.MetadataEntry.value",
        "EnvironmentSpec.system_prompt",
        "EnvironmentSpec.OptionsEntry.value",
        "RewardSpec.OptionsEntry.value",
        "PromptSource.MetadataEntry.value",
        "InvokeRequest.args_json",
        "InvokeRequest.kwargs_json",
    )
}


def limits(**changes: Any) -> Limits:
    """:class:`Limits` with some bounds changed; ``fields`` entries are added to the bulk-text ones."""
    extra = changes.pop("fields", {})
    return Limits(**changes, fields={**BULK_TEXT_FIELDS, **extra})


DEFAULT_LIMITS = Limits()


def _is_id_field(fd: FieldDescriptor) -> bool:
    n = fd.name
    return n.endswith("_id") or n.endswith("_ids") or n in ID_FIELD_NAMES


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def check_limits(message: Message, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ``errors.InvalidArgument`` naming the first field of ``message`` over its bound.

    Only set fields are visited (``ListFields``), so the cost is proportional to what the caller sent; the field
    path of the error is built only when there is one.
    """
    try:
        _walk(message, limits, 0)
    except _Over as over:
        raise errors.InvalidArgument("".join(reversed(over.path)).lstrip("."), over.message) from None


class _Over(Exception):
    """A bound was exceeded; the path is collected (innermost first) while the walk unwinds."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.path = [part]
        self.message = message


# What to check of each field of a message type, per Limits instance: (kind, bound, name, value bound).
_MAP, _MAP_MSG, _REP_MSG, _REP_STR, _REP, _MSG, _STR = range(7)
_plans: dict[tuple[int, str], dict[FieldDescriptor, tuple[int, int, str, int]]] = {}


def _plan(desc: Descriptor, limits: Limits) -> dict[FieldDescriptor, tuple[int, int, str, int]]:
    key = (id(limits), desc.full_name)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    plan = {}
    for fd in desc.fields:
        bound = limits.fields.get(fd.full_name)
        if _is_map(fd):
            if fd.message_type is None:  # a map field's entry type is always set; never silently skip one
                raise TypeError(f"{fd.full_name}: map field without an entry type")
            value_fd = fd.message_type.fields_by_name["value"]
            kind = _MAP_MSG if value_fd.type == FieldDescriptor.TYPE_MESSAGE else _MAP
            value_bound = limits.fields.get(value_fd.full_name) or limits.max_string_chars
            plan[fd] = (kind, bound or limits.max_map_entries, fd.name, value_bound)
        elif fd.is_repeated and fd.type == FieldDescriptor.TYPE_MESSAGE:
            plan[fd] = (_REP_MSG, bound or limits.max_messages, fd.name, 0)
        elif fd.is_repeated:
            per_item = ID_CHARS if _is_id_field(fd) else limits.max_string_chars
            kind = _REP_STR if fd.type == FieldDescriptor.TYPE_STRING else _REP
            plan[fd] = (kind, bound or limits.max_scalars, fd.name, per_item)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            plan[fd] = (_MSG, 0, fd.name, 0)
        elif fd.type == FieldDescriptor.TYPE_STRING:
            plan[fd] = (_STR, bound or (ID_CHARS if _is_id_field(fd) else limits.max_string_chars), fd.name, 0)
    if len(_plans) < 4096:  # message types x Limits instances: small; never unbounded
        _plans[key] = plan
    return plan


def _walk(msg: Message, limits: Limits, depth: int) -> None:
    if depth > limits.max_depth:
        raise _Over("", f"nests messages deeper than {limits.max_depth}")
    # The protobuf stub's DESCRIPTOR is a union with upb's Descriptor, the same class at runtime.
    plan = _plan(msg.DESCRIPTOR, limits)  # type: ignore[arg-type]
    for fd, value in msg.ListFields():
        entry = plan.get(fd)
        if entry is None:
            continue  # numbers, bools, bytes: bounded by their type or the receive limit
        kind, bound, name, inner = entry
        if kind == _STR:
            if len(value) > bound:
                raise _Over("." + name, f"must be at most {bound} characters, got {len(value)}")
            continue
        if kind == _MSG:
            try:
                _walk(value, limits, depth + 1)
            except _Over as over:
                over.path.append("." + name)
                raise
            continue
        if len(value) > bound:
            raise _Over("." + name, f"must hold at most {bound} entries, got {len(value)}")
        if kind == _REP_MSG:
            for i, item in enumerate(value):
                try:
                    _walk(item, limits, depth + 1)
                except _Over as over:
                    over.path.append(f".{name}[{i}]")
                    raise
        elif kind == _REP_STR:
            for i, item in enumerate(value):
                if len(item) > inner:
                    raise _Over(f".{name}[{i}]", f"must be at most {inner} characters, got {len(item)}")
        elif kind in (_MAP, _MAP_MSG):
            for key in value:
                if isinstance(key, str) and len(key) > ID_CHARS:
                    raise _Over("." + name, f"has a key of {len(key)} characters (at most {ID_CHARS})")
                item = value[key]
                if kind == _MAP_MSG:
                    try:
                        _walk(item, limits, depth + 1)
                    except _Over as over:
                        over.path.append(f".{name}[{errors.shorten(key, 40)}]")
                        raise
                elif isinstance(item, str) and len(item) > inner:
                    where = f".{name}[{errors.shorten(key, 40)}]"
                    raise _Over(where, f"must be at most {inner} characters, got {len(item)}")
