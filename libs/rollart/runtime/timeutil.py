"""google.protobuf Timestamp/Duration helpers, one copy for every service.

Conventions:

* Time values in Python are float seconds (``time.time()`` for wall-clock instants); :func:`timestamp` and
  :func:`duration` build messages from them, :func:`seconds` reads either kind back.
* :func:`duration` clamps a negative value to zero (a deadline already passed is "no time left").
* A Duration that comes *from a caller* goes through :func:`checked_duration`, which raises
  ``errors.InvalidArgument`` naming the field when it is negative, malformed or longer than allowed.
"""

from __future__ import annotations

import datetime as _dt
import math
import time

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from . import errors

#: The longest Duration protobuf can represent (10,000 years), in seconds.
MAX_DURATION_S = 315_576_000_000
_NANOS = 1_000_000_000

__all__ = [
    "MAX_DURATION_S",
    "checked_duration",
    "datetime_of",
    "duration",
    "duration_ms",
    "milliseconds",
    "now",
    "seconds",
    "timestamp",
    "timestamp_ms",
]


def _split(secs: float) -> tuple[int, int]:
    """(seconds, nanos) of float seconds, nanos in [0, 1e9): exact for the fraction (no 1e9 float product)."""
    whole = math.floor(secs)
    nanos = round((secs - whole) * _NANOS)
    if nanos >= _NANOS:
        whole, nanos = whole + 1, nanos - _NANOS
    return int(whole), int(nanos)


def timestamp(t: float | _dt.datetime | None = None) -> Timestamp:
    """A Timestamp at ``t``: epoch seconds, an aware datetime (naive means UTC), or now when ``None``."""
    ts = Timestamp()
    if t is None:
        ts.FromNanoseconds(time.time_ns())
    elif isinstance(t, _dt.datetime):
        ts.FromDatetime(t if t.tzinfo else t.replace(tzinfo=_dt.UTC))
    else:
        ts.seconds, ts.nanos = _split(t)
    return ts


def now() -> Timestamp:
    """The current wall-clock time."""
    return timestamp()


def timestamp_ms(ms: float) -> Timestamp:
    """A Timestamp at ``ms`` epoch milliseconds (the ledger's Redis records keep milliseconds)."""
    ts = Timestamp()
    ts.FromMilliseconds(int(ms))
    return ts


def duration(secs: float, *, field: str = "duration") -> Duration:
    """A Duration of ``secs`` seconds; negative values become zero.

    Raises ``errors.InvalidArgument(field, ...)`` for NaN, infinity or more than :data:`MAX_DURATION_S`.
    """
    if math.isnan(secs) or secs > MAX_DURATION_S:
        raise errors.InvalidArgument(field, f"must be a finite duration of at most {MAX_DURATION_S} s")
    d = Duration()
    d.seconds, d.nanos = _split(max(secs, 0.0))
    return d


def duration_ms(ms: float, *, field: str = "duration") -> Duration:
    """A Duration of ``ms`` milliseconds, truncated to whole milliseconds (the ledger's Redis records keep
    milliseconds); negative values become zero."""
    if math.isnan(ms) or ms > MAX_DURATION_S * 1000:
        raise errors.InvalidArgument(field, f"must be a finite duration of at most {MAX_DURATION_S} s")
    d = Duration()
    d.FromMilliseconds(int(max(ms, 0.0)))
    return d


def seconds(value: Duration | Timestamp) -> float:
    """Float seconds of a Duration, or epoch seconds of a Timestamp."""
    return value.seconds + value.nanos / _NANOS


def milliseconds(value: Duration | Timestamp) -> float:
    """Float milliseconds of a Duration, or epoch milliseconds of a Timestamp."""
    return value.seconds * 1000.0 + value.nanos / 1e6


def datetime_of(ts: Timestamp) -> _dt.datetime:
    """The aware (UTC) datetime of a Timestamp."""
    return ts.ToDatetime(tzinfo=_dt.UTC)


def checked_duration(field: str, d: Duration, *, max_seconds: float | None = None) -> float:
    """Seconds of a caller's Duration; raises ``errors.InvalidArgument(field, ...)`` if it is out of range.

    Out of range: negative, nanos outside ``[0, 1e9)``, beyond what protobuf allows, or above ``max_seconds``.
    An unset Duration is zero.
    """
    if d.seconds < 0 or d.nanos < 0:
        raise errors.InvalidArgument(field, "must not be negative")
    if d.nanos >= _NANOS or d.seconds > MAX_DURATION_S:
        raise errors.InvalidArgument(field, "is not a valid duration")
    if max_seconds is not None and seconds(d) > max_seconds:
        raise errors.InvalidArgument(field, f"must be at most {max_seconds:g} s")
    return seconds(d)
