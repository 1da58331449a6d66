"""Running a child to completion with a wall-clock timeout, bounded output and a process-group kill."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, cast


@dataclass
class RunOutcome:
    returncode: int  # negative: killed by that signal (subprocess convention)
    stdout: bytes
    stderr: bytes
    timed_out: bool
    duration_s: float
    truncated: bool


class _Tail:
    """Keeps the last ``limit`` bytes of a stream (errors are at the end)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.dropped = False

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]
            self.dropped = True


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it was started in its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def run(
    argv: Sequence[str],
    *,
    input: bytes | None = None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    user: int | None = None,
    group: int | None = None,
    pass_fds: Sequence[int] = (),
    output_limit: int = 1 << 20,
    on_timeout: Callable[[subprocess.Popen], None] | None = None,
) -> RunOutcome:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
        user=user,
        group=group,
        extra_groups=[] if user is not None else None,
        pass_fds=tuple(pass_fds),
        close_fds=True,
    )
    out, err = _Tail(output_limit), _Tail(output_limit)
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    pending = memoryview(input) if input is not None else None
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        if pending is not None and len(pending):
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        else:
            proc.stdin.close()
    deadline = t0 + max(timeout, 0.0)
    timed_out = False
    drain_until: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if drain_until is None and proc.poll() is not None:
                # The command exited; leftovers (background children holding the pipes) get a short grace.
                drain_until = now + 0.5
            if drain_until is not None and now >= drain_until:
                break
            left = deadline - now
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.1 if drain_until else 0.5)):
                if key.data is None:  # stdin ready for more input
                    assert pending is not None
                    try:
                        n = os.write(key.fd, pending[:65536])
                        pending = pending[n:]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not len(pending):
                        sel.unregister(key.fileobj)
                        cast(IO[bytes], key.fileobj).close()  # registered: the process's pipes
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
        if not timed_out:
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out and on_timeout is not None:
            on_timeout(proc)
        kill_group(proc)  # also reaps background children of a finished command
        proc.wait()
    finally:
        for key in list(sel.get_map().values()):
            try:
                cast(IO[bytes], key.fileobj).close()
            except OSError:
                pass
        sel.close()
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()
    return RunOutcome(
        returncode=proc.returncode,
        stdout=bytes(out.buf),
        stderr=bytes(err.buf),
        timed_out=timed_out,
        duration_s=time.monotonic() - t0,
        truncated=out.dropped or err.dropped,
    )
