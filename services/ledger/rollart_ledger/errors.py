"""The one error the ledger's core raises: a request its state refuses.

The scripts (``redis.error_reply('CODE message')``) and step planning raise :class:`LedgerError`; the servicer
turns it into the gRPC status named by ``code``. A rejected request changed nothing.
"""

from __future__ import annotations


class LedgerError(Exception):
    """A refused request; ``code`` is a gRPC status name (``NOT_FOUND``, ``FAILED_PRECONDITION``, ...)."""

    CODES = frozenset(
        {"NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT", "ALREADY_EXISTS", "OUT_OF_RANGE", "ABORTED"}
    )

    def __init__(self, code: str, message: str) -> None:
        if code not in self.CODES:
            raise ValueError(f"LedgerError code must be one of {sorted(self.CODES)}, got {code!r}")
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
