"""Starting and stopping local processes: redis-server and RollArt services (used by `rollart up` and tests)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class ProcessError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ManagedProcess:
    """A child process in its own session, logging to a file, stopped with SIGTERM then SIGKILL."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        ready_file: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.ready_file = ready_file
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.ready_file is not None and self.ready_file.exists():
            self.ready_file.unlink()
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # signals to the caller's terminal do not reach it; stop() does
            )
        except FileNotFoundError as exc:
            raise ProcessError(f"{self.name}: cannot run {self.argv[0]!r}: {exc}") from exc
        finally:
            log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 30.0) -> dict:
        """Wait for the ready file (JSON written by the service once serving); fail fast if the process dies."""
        if self.ready_file is None:
            raise ProcessError(f"{self.name}: no ready file configured")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                return json.loads(self.ready_file.read_text())
            if not self.alive():
                if self.proc is None:
                    raise ProcessError(f"{self.name}: wait_ready() before start()")
                raise ProcessError(
                    f"{self.name} exited with code {self.proc.returncode} before it was ready; "
                    f"last lines of {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)
        raise ProcessError(
            f"{self.name} not ready after {timeout:.0f}s; last lines of {self.log_path}:\n{_tail(self.log_path)}"
        )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.alive():
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        return self.proc.returncode


def stop_pid(pid: int, timeout: float = 15.0) -> bool:
    """Stop a process we did not start in this Python process (rollart down). True if it is gone."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return True
    targets = [pgid] if pgid == pid else []
    try:
        if targets:
            os.killpg(pgid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    try:
        if targets:
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    time.sleep(0.1)
    return not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise ProcessError("redis-server is not installed (run `make setup`, or apt-get install redis-server)")
    return path


def start_redis(
    workdir: Path, *, port: int | None = None, appendfsync: str = "always", name: str = "redis"
) -> tuple[ManagedProcess, str]:
    """A private redis-server with AOF (every acknowledged write on disk) on a free loopback port."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [
        redis_server_binary(),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(workdir),
        "--appendonly", "yes",
        "--appendfsync", appendfsync,
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
    ]  # fmt: skip
    proc = ManagedProcess(name, argv, log_path=workdir / "redis.log").start()
    import redis  # local import: only callers that start Redis need the client

    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if not proc.alive() or time.monotonic() > deadline:
                proc.stop()
                raise ProcessError(f"redis-server did not start; log:\n{_tail(proc.log_path)}") from None
            time.sleep(0.05)
    client.close()
    return proc, f"redis://127.0.0.1:{port}/0"
