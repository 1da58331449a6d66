"""Hostile requests for any RPC, built from the generated descriptors alone (no knowledge of the services).

For a request type, :func:`cases` yields ``(label, bytes)`` pairs: the empty message; every field (and the fields
of nested messages, two levels down) set to extremes of its type (integer limits, NaN and infinities, huge and
odd strings, unknown enum values, out-of-range Durations, long lists and maps); fields sent with the wrong wire
type or invalid UTF-8; truncated and random bytes. A seeded ``random.Random`` picks a bounded sample per RPC.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

F = FieldDescriptor
INT32 = {F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32}
INT64 = {F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64}
UINT32 = {F.TYPE_UINT32, F.TYPE_FIXED32}
UINT64 = {F.TYPE_UINT64, F.TYPE_FIXED64}
FLOATS = {F.TYPE_FLOAT, F.TYPE_DOUBLE}
STRINGS = ["", "x" * 70_000, "\x00\n\t../../etc/passwd%s{}", "é" * 300, "a b", "-1", "NaN"]
# Long unicode for every string field (issue 30): right-to-left marks and overrides, emoji and accents under
# the usual 1,024-character bound but over NAME_MAX (255) bytes; the same with a NUL; and 4 KiB+ of them.
_RTL_EMOJI = "\u200f🧪\u202eé" * 225  # 900 characters, 2,700 UTF-8 bytes
UNICODE_STRINGS = {
    "rtl-emoji-900": _RTL_EMOJI,
    "nul-rtl": "a/\x00/" + _RTL_EMOJI[:400],
    "rtl-emoji-4k": "🧪\u202e" * 2100,  # 4,200 characters, 14.7 KB
}
TIME_TYPES = {"google.protobuf.Duration", "google.protobuf.Timestamp"}

Setter = Callable[[Message], None]


def new(desc: Descriptor) -> Message:
    return message_factory.GetMessageClass(desc)()


def scalar_values(fd: FieldDescriptor) -> list:
    t = fd.type
    if t in INT32:
        return [2**31 - 1, -(2**31), -1]
    if t in INT64:
        return [2**63 - 1, -(2**63), -1]
    if t in UINT32:
        return [2**32 - 1]
    if t in UINT64:
        return [2**64 - 1]
    if t in FLOATS:
        return [math.nan, math.inf, -math.inf, -3e38 if t == F.TYPE_FLOAT else -1e308]
    if t == F.TYPE_BOOL:
        return [True]
    if t == F.TYPE_ENUM:
        return [999, -7]
    if t == F.TYPE_STRING:
        return STRINGS
    if t == F.TYPE_BYTES:
        return [b"", bytes(range(256)) * 16]
    return []


def _time_values(desc: Descriptor) -> list[Message]:
    out = []
    for secs, nanos in ((2**63 - 1, 0), (0, -5), (-1, 0), (-(2**63), -999_999_999), (315_576_000_001, 0)):
        m = new(desc)
        m.seconds, m.nanos = secs, nanos
        out.append(m)
    return out


def message_values(desc: Descriptor, depth: int, base: Message | None = None) -> list[tuple[str, Message]]:
    """Nested messages to put in a field: extremes of the time types, else the nested variants (of ``base``)."""
    if desc.full_name in TIME_TYPES:
        return [(f"{m.seconds}s{m.nanos}n", m) for m in _time_values(desc)]
    if depth >= 2:
        return [("empty", new(desc))]
    return [(label, m) for label, m in variants(desc, depth + 1, base)]


def field_setters(fd: FieldDescriptor, depth: int, base: Message | None = None) -> Iterator[tuple[str, Setter]]:
    name = fd.name
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        key_fd, val_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        key = "k" * 300 if key_fd.type == F.TYPE_STRING else 2**31 - 1
        if val_fd.type == F.TYPE_MESSAGE:
            yield f"{name}{{huge key}}", lambda m: getattr(m, name)[key].SetInParent()
            yield f"{name}{{5000 entries}}", lambda m: [getattr(m, name)[_key(key_fd, i)].SetInParent()
                                                         for i in range(5000)]
            return
        for value in scalar_values(val_fd)[:4]:
            yield f"{name}{{k: {str(value)[:20]}}}", lambda m, v=value: getattr(m, name).__setitem__(_key(key_fd, 0), v)
        big = scalar_values(val_fd)[0]
        yield f"{name}{{5000 entries}}", lambda m: getattr(m, name).update({_key(key_fd, i): big for i in range(5000)})
        return
    if fd.is_repeated:
        if fd.type == F.TYPE_MESSAGE:
            for label, value in message_values(fd.message_type, depth):
                yield f"{name}[{label}]", lambda m, v=value: getattr(m, name).add().CopyFrom(v)
            yield f"{name}[20000 empty]", lambda m: [getattr(m, name).add() for _ in range(20_000)]
        else:
            for value in scalar_values(fd):
                yield f"{name}[{str(value)[:20]}]", lambda m, v=value: getattr(m, name).append(v)
            many = scalar_values(fd)[0] if fd.type != F.TYPE_STRING else "y" * 10
            yield f"{name}[x50000]", lambda m: getattr(m, name).extend([many] * 50_000)
        return
    if fd.type == F.TYPE_MESSAGE:
        nested = getattr(base, name) if base is not None and base.HasField(name) else None
        for label, value in message_values(fd.message_type, depth, nested):
            yield f"{name}={{{label}}}", lambda m, v=value: getattr(m, name).CopyFrom(v)
        return
    for value in scalar_values(fd):
        yield f"{name}={str(value)[:20]!s}", lambda m, v=value: setattr(m, name, v)


def _key(key_fd: FieldDescriptor, i: int):
    return f"k{i}" if key_fd.type == F.TYPE_STRING else i


def variants(desc: Descriptor, depth: int = 0, base: Message | None = None) -> Iterator[tuple[str, Message]]:
    """The empty message (or ``base``), then one message per field extreme (fields of nested messages
    recursively), each a copy of ``base`` (a valid request, when given) with that one field changed."""
    yield ("base" if base is not None else "empty"), base if base is not None else new(desc)
    for fd in desc.fields:
        for label, setter in field_setters(fd, depth, base):
            m = new(desc)
            if base is not None:
                m.CopyFrom(base)
                if fd.is_repeated or fd.message_type is not None:
                    m.ClearField(fd.name)  # the extreme replaces the field, it is not appended to it
            try:
                setter(m)
            except (ValueError, TypeError, OverflowError):
                continue  # the Python runtime itself refuses this value: the wire-level cases cover it
            yield label, m


def unicode_variants(
    desc: Descriptor, base: Message | None = None, depth: int = 0
) -> Iterator[tuple[str, Message]]:
    """For every string field (map keys and values, repeated strings, and the string fields of nested messages
    two levels down), a copy of ``base`` (or the empty message) with that one field set to each of
    :data:`UNICODE_STRINGS` (not sampled: every field gets every value)."""
    for fd in desc.fields:
        name = fd.name
        values: list[tuple[str, str, object]] = []  # (label, how, value)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key_fd, val_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            for label, text in UNICODE_STRINGS.items():
                if key_fd.type == F.TYPE_STRING and val_fd.type in (F.TYPE_MESSAGE, F.TYPE_STRING):
                    values.append((f"{name}{{key {label}}}", "map-key", text))
                if val_fd.type == F.TYPE_STRING:
                    values.append((f"{name}{{value {label}}}", "map-value", text))
        elif fd.type == F.TYPE_STRING:
            for label, text in UNICODE_STRINGS.items():
                values.append((f"{name}[{label}]" if fd.is_repeated else f"{name}={label}", "string", text))
        elif fd.type == F.TYPE_MESSAGE and depth < 2 and fd.message_type.full_name not in TIME_TYPES:
            nested = None
            if base is not None and not fd.is_repeated and base.HasField(name):
                nested = getattr(base, name)
            elif base is not None and fd.is_repeated and len(getattr(base, name)):
                nested = getattr(base, name)[0]
            for label, sub in unicode_variants(fd.message_type, nested, depth + 1):
                values.append((f"{name}[{label}]" if fd.is_repeated else f"{name}.{label}", "message", sub))
        for label, how, value in values:
            m = new(desc)
            if base is not None:
                m.CopyFrom(base)
                if fd.is_repeated or fd.message_type is not None:
                    m.ClearField(name)
            field = getattr(m, name) if fd.is_repeated or fd.message_type is not None else None
            if how == "map-key":
                if fd.message_type.fields_by_name["value"].type == F.TYPE_MESSAGE:
                    field[value].SetInParent()
                else:
                    field[value] = "v"
            elif how == "map-value":
                field[_key(fd.message_type.fields_by_name["key"], 0)] = value
            elif how == "string":
                if fd.is_repeated:
                    field.append(value)
                else:
                    setattr(m, name, value)
            else:
                target = field.add() if fd.is_repeated else field
                target.CopyFrom(value)
            yield label, m


def unicode_cases(method: MethodDescriptor, base: Message | None = None) -> list[tuple[str, bytes]]:
    """:func:`unicode_variants` of the request type, of ``base`` (a valid request) when given, serialized."""
    out = [(f"unicode {label}", m.SerializeToString()) for label, m in unicode_variants(method.input_type)]
    if base is not None:
        seeded = unicode_variants(method.input_type, base)
        out += [(f"unicode seeded {label}", m.SerializeToString()) for label, m in seeded]
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def wire_cases(desc: Descriptor) -> Iterator[tuple[str, bytes]]:
    """Wrong wire types, invalid UTF-8, truncation, unknown fields and random bytes."""
    for fd in desc.fields[:8]:
        if fd.type in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE) or fd.is_repeated:
            yield f"{fd.name}:varint", _varint(fd.number << 3 | 0) + _varint(2**63)
        else:
            yield f"{fd.name}:length-delimited", _varint(fd.number << 3 | 2) + b"\x03abc"
        if fd.type == F.TYPE_STRING:
            yield f"{fd.name}:bad-utf8", _varint(fd.number << 3 | 2) + b"\x04\xff\xfe\xc0\x80"
        if fd.type == F.TYPE_MESSAGE:
            yield f"{fd.name}:truncated", _varint(fd.number << 3 | 2) + b"\x7f\x08"
    yield "length past the end", b"\x0a\xff\xff\xff\xff\x0f" + b"z" * 10
    yield "unknown fields", _varint(999 << 3 | 2) + b"\x05hello" + _varint(1000 << 3 | 0) + b"\x01"
    yield "end-group tag", b"\x0c"
    rng = random.Random(desc.full_name)
    for size in (1, 7, 64, 4096):
        yield f"random{size}", bytes(rng.getrandbits(8) for _ in range(size))


def cases(
    method: MethodDescriptor, rng: random.Random, per_method: int, base: Message | None = None
) -> list[tuple[str, bytes]]:
    """At most ``per_method`` message variants (sampled with ``rng``; mutations of ``base`` when given, plus
    those of the empty message) plus every wire-level case."""
    out = []
    seeded = list(variants(method.input_type, 0, base)) if base is not None else []
    for label, m in seeded + list(variants(method.input_type)):
        try:
            out.append((label, m.SerializeToString()))
        except Exception:  # noqa: BLE001 - e.g. invalid surrogates: not sendable by this runtime
            continue
    if len(out) > per_method:
        out = out[:1] + rng.sample(out[1:], per_method - 1)
    return out + list(wire_cases(method.input_type))


def oversized(method: MethodDescriptor, size: int) -> bytes:
    """About ``size`` bytes of a request that is expensive to parse: many small entries of a repeated field or
    map (each a message with a map entry where one exists), else unknown fields."""
    desc = method.input_type
    for fd in desc.fields:
        if fd.is_repeated and fd.type == F.TYPE_MESSAGE:
            entry = new(fd.message_type)
            for sub in fd.message_type.fields:
                if sub.message_type is not None and sub.message_type.GetOptions().map_entry:
                    kf, vf = sub.message_type.fields_by_name["key"], sub.message_type.fields_by_name["value"]
                    if vf.type == F.TYPE_STRING:
                        getattr(entry, sub.name)[_key(kf, 1)] = "v"
                        break
            one = _varint(fd.number << 3 | 2) + _varint(entry.ByteSize()) + entry.SerializeToString()
            return one * max(1, size // len(one))
    one = _varint(1000 << 3 | 0) + b"\x01"
    return one * (size // len(one))
