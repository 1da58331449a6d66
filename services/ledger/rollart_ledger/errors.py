"""The one error the ledger's core raises: a request its state refuses.

The scripts (``redis.error_reply('CODE message')``) and step planning raise :class:`LedgerError`, a
``rollart.runtime.errors.Coded`` error: the server's one mapper ends the call with the status ``code`` names. A
rejected request changed nothing. See docs/ledger.md.
"""

from __future__ import annotations

from rollart.runtime import errors


class LedgerError(errors.Coded):
    """A refused request; ``code`` is a gRPC status name (``NOT_FOUND``, ``FAILED_PRECONDITION``, ...)."""

    CODES = frozenset(
        {"NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT", "ALREADY_EXISTS", "OUT_OF_RANGE", "ABORTED"}
    )

    def __init__(self, code: str, message: str) -> None:
        if code not in self.CODES:
            raise ValueError(f"LedgerError code must be one of {sorted(self.CODES)}, got {code!r}")
        super().__init__(code, message)
