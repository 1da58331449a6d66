"""Work buffers the encoder reuses from one tensor, and one delta, to the next.

A fresh large numpy array costs a page fault per 4 KiB page on first write (the kernel zeroes each page): for
the changed positions of a 10%-changed model that was ~20% of the scan's CPU. :class:`Scratch` keeps the
encoder's per-tensor intermediates (positions, new values, the gap stream, value byte planes) and hands out
views of them. A view is valid until the same buffer is asked for again, so only code that finishes with a
tensor's intermediates before the next tensor is extracted may use one (:class:`~rollart.delta.DeltaEncoder`
does: every segment of a tensor is sealed, as bytes of its own, before the next tensor is compared).

:func:`acquire` / :func:`release` keep a few of them for the process, so every delta encoded in turn reuses
the same pages and two encoders running at once (threads, or interleaved generators) never share one.
"""

from __future__ import annotations

import threading

import numpy as np

MAX_KEPT_BYTES = 256 << 20  # a larger buffer is handed out fresh and not kept (memory held between deltas)
_POOL_SIZE = 2

_pool: list[Scratch] = []
_lock = threading.Lock()


class Scratch:
    """Named, growable buffers; :meth:`array` returns a view of ``count`` elements of ``dtype``."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def array(self, name: str, count: int, dtype: type | np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        buf = self._bufs.get(name)
        if buf is None or buf.nbytes < nbytes:
            if nbytes > MAX_KEPT_BYTES:
                return np.empty(count, dtype)
            size = max(nbytes, min(MAX_KEPT_BYTES, buf.nbytes * 5 // 4 if buf is not None else 0))
            buf = self._bufs[name] = np.empty(size, np.uint8)  # numpy aligns it for any element type
        return buf[:nbytes].view(dtype)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())


def acquire() -> Scratch:
    """A scratch no one else uses (from the pool, or new)."""
    with _lock:
        return _pool.pop() if _pool else Scratch()


def release(scratch: Scratch) -> None:
    """Give a scratch back for the next encoder (kept only while the pool has room)."""
    with _lock:
        if len(_pool) < _POOL_SIZE and scratch not in _pool:
            _pool.append(scratch)
