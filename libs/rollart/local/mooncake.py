"""A real ``mooncake_master`` on free loopback ports, for `rollart up` and tests.

The Mooncake wheel (``mooncake-transfer-engine-non-cuda``) ships the binary as a console script next to
the interpreter and inside the ``mooncake`` package; nothing here imports mooncake itself.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .processes import ManagedProcess, ProcessError, _tail, free_port


def mooncake_master_binary() -> str | None:
    """The ``mooncake_master`` of this interpreter's environment, else one on PATH, else None."""
    local = Path(sys.executable).parent / "mooncake_master"
    if local.exists():
        return str(local)
    found = shutil.which("mooncake_master")
    if found:
        return found
    spec = importlib.util.find_spec("mooncake")  # locates the package without importing it
    for loc in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(loc) / "mooncake_master"
        if candidate.exists():
            return str(candidate)
    return None


@dataclass
class MooncakeMaster:
    """A running master. ``restart()`` brings it back on the same ports (with an empty store, as a real
    restart does: the master keeps no state)."""

    workdir: Path
    host: str
    rpc_port: int
    metrics_port: int
    extra_args: list[str] = field(default_factory=list)
    proc: ManagedProcess | None = None
    restarts: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.workdir / "mooncake_master.log"

    def argv(self, binary: str) -> list[str]:
        return [
            binary,
            f"--rpc_address={self.host}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={self.host}",
            f"--metrics_port={self.metrics_port}",
            # A read's lease must outlast its transfer (else LEASE_EXPIRED): 1 GB buckets into fresh
            # memory on a busy 2-core host can take longer than the default 10 s.
            "--default_kv_lease_ttl=60s",
            *self.extra_args,
        ]

    def start(self, timeout: float = 20.0) -> MooncakeMaster:
        binary = mooncake_master_binary()
        if binary is None:
            raise ProcessError("mooncake_master is not installed (pip install mooncake-transfer-engine-non-cuda)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = ManagedProcess(
            "mooncake-master", self.argv(binary), log_path=self.log_path, cwd=self.workdir
        ).start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Ready = the metrics endpoint reports service_ready and the RPC port accepts connections."""
        deadline = time.monotonic() + timeout
        url = f"http://{self.host}:{self.metrics_port}/health"
        while time.monotonic() < deadline:
            if not self.alive():
                if self.proc is None or self.proc.proc is None:
                    raise ProcessError("mooncake_master: wait_ready() before start()")
                raise ProcessError(
                    f"mooncake_master exited with code {self.proc.proc.returncode}; "
                    f"last lines of {self.log_path}:\n{_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    ready = json.loads(resp.read()).get("service_ready", False)
                if ready:
                    socket.create_connection((self.host, self.rpc_port), timeout=1).close()
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        raise ProcessError(f"mooncake_master not ready after {timeout:.0f}s; log:\n{_tail(self.log_path)}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            self.proc.stop(timeout)

    def kill(self) -> None:
        """SIGKILL (fault tests): clients see RPC failures until a master is back."""
        if self.proc is not None:
            self.proc.kill()

    def restart(self, timeout: float = 20.0) -> MooncakeMaster:
        self.kill()
        self.restarts += 1
        return self.start(timeout)

    def info(self) -> dict:
        return {
            "pid": self.pid,
            "address": self.address,
            "metrics_port": self.metrics_port,
            "log": str(self.log_path),
        }


def start_mooncake_master(
    workdir: Path,
    *,
    host: str = "127.0.0.1",
    rpc_port: int | None = None,
    metrics_port: int | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 20.0,
    attempts: int = 3,
) -> MooncakeMaster:
    """Start a master; with no ports given, free ones are picked (retried if another process wins one)."""
    last: ProcessError | None = None
    for _ in range(attempts):
        master = MooncakeMaster(
            Path(workdir), host, rpc_port or free_port(host), metrics_port or free_port(host), list(extra_args or [])
        )
        try:
            return master.start(timeout)
        except ProcessError as e:
            last = e
            if rpc_port and metrics_port:
                break
    assert last is not None
    raise last
