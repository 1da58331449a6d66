"""bubblewrap sandboxes: no network, own PID/IPC/UTS namespaces, read-only root, a writable workspace, rlimits.

The host root is bound read-only (each top-level directory), the workspace is bound writable at /workspace.

Each command is a fresh ``bwrap`` over the same workspace (processes never outlive their command: the PID
namespace dies with it). When the envmanager runs as root, every sandbox runs as its own unprivileged uid
(a random one from a high range): rlimits on processes then hold (root is exempt from RLIMIT_NPROC), the
sandbox owns nothing on the host, and concurrent sandboxes cannot touch each other's files.

Host directories that may hold secrets or control sockets (``/root``, ``/home``, ``/run`` with the Docker
socket, ``/tmp``, ...) are hidden behind empty tmpfs mounts; the Python installation and the packages the
environments need are bound back read-only when they live below one of them.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from . import _proc
from .base import BWRAP, ExecResult, SandboxLimits
from .errors import FailureCause, SandboxFailure
from .local import ProcessSandbox, rlimit_argv

DEFAULT_HIDDEN = ("/root", "/home", "/run", "/var/run", "/tmp", "/var/tmp", "/var/lib/docker", "/mnt", "/media")
UID_BASE = 1_000_000
UID_SPAN = 1_000_000


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def exposed_paths(hidden: Iterable[str]) -> list[str]:
    """Paths this interpreter needs (prefixes, sys.path) that lie under a hidden directory: bound back read-only."""
    hidden = [os.path.realpath(h) for h in hidden if os.path.isdir(h) and not os.path.islink(h)]
    wanted: set[str] = set()
    for p in [sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable), *sys.path]:
        if not p:
            continue
        for candidate in {p, os.path.realpath(p)}:
            # strictly below a hidden directory (a script's own directory, e.g. /tmp itself, stays hidden)
            if os.path.exists(candidate) and any(_under(candidate, h) and candidate != h for h in hidden):
                wanted.add(candidate)
    real_exe = os.path.realpath(sys.executable)
    if any(_under(real_exe, h) for h in hidden):
        # the venv's python is a symlink into e.g. /root/.pyenv: bind the interpreter's installation
        wanted.add(os.path.dirname(os.path.dirname(real_exe)))
    # keep outermost paths only
    out: list[str] = []
    for p in sorted(wanted, key=len):
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


@functools.lru_cache(maxsize=1)
def availability() -> tuple[bool, str]:
    """(works, reason): bwrap is installed and can create the namespaces this backend uses."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bwrap is not installed (Debian package 'bubblewrap')"
    sb = BwrapSandbox(SandboxLimits(time_budget_s=30, step_timeout_s=15, pids_limit=16))
    try:
        with sb:
            result = sb.exec(["true"])
        if result.exit_code != 0:
            return False, f"bwrap test command failed: {result.text(300)}"
    except SandboxFailure as exc:
        return False, f"bwrap cannot create its sandbox here: {exc}"
    return True, ""


class BwrapSandbox(ProcessSandbox):
    backend = BWRAP
    workspace = "/workspace"
    uses_status_fd = True

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        sandbox_id: str | None = None,
        root_dir: str | None = None,
        hidden: Sequence[str] = DEFAULT_HIDDEN,
        extra_ro_binds: Sequence[str] = (),
        uid: int | None = None,
    ) -> None:
        super().__init__(limits, sandbox_id=sandbox_id, root_dir=root_dir)
        if self.limits.writable_root:
            raise SandboxFailure(
                FailureCause.SETUP, "bwrap sandboxes keep the host root read-only (writable_root unsupported)",
                backend=BWRAP,
            )
        self.hidden = [h for h in hidden if os.path.isdir(h) and not os.path.islink(h)]
        self.ro_binds = [*exposed_paths(self.hidden), *extra_ro_binds]
        self.privileged = os.geteuid() == 0
        # Root: a private uid per sandbox. Otherwise we already are unprivileged.
        self.uid = uid if uid is not None else (UID_BASE + secrets.randbelow(UID_SPAN) if self.privileged else None)
        if not self.privileged:
            self.uid = None
        self.exe = shutil.which("bwrap") or "bwrap"
        self.setpriv = shutil.which("setpriv") or "setpriv"
        if self.privileged and shutil.which("setpriv") is None:
            raise SandboxFailure(
                FailureCause.UNAVAILABLE, "running as root needs setpriv (util-linux) to drop privileges", backend=BWRAP
            )

    def _start(self) -> None:
        super()._start()
        assert self.host_workspace is not None
        if self.uid is not None:
            os.chown(self.host_workspace, self.uid, self.uid)

    def run_user(self) -> tuple[int | None, int | None]:
        return (None, None) if self.privileged else (self.uid, self.uid)

    def host_cwd(self, cwd: str) -> str | None:
        return None  # bwrap --chdir

    def resolve_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.workspace
        return cwd if os.path.isabs(cwd) else os.path.join(self.workspace, cwd)

    def command_env(self, env: dict[str, str]) -> dict[str, str]:
        out = super().command_env(env)
        out.setdefault("HOME", self.workspace)
        if "TMPDIR" not in env:
            out["TMPDIR"] = "/tmp"
        return out

    def wrap(self, argv: list[str], *, cwd: str, cpu_seconds: float, extra_fds: Sequence[int] = ()) -> list[str]:
        assert self.host_workspace is not None
        mib = 1024 * 1024
        # Root: bwrap sets up the namespaces privileged, then setpriv drops to the sandbox's own uid (all
        # capabilities gone, no new privileges); RLIMIT_NPROC then counts exactly this sandbox's processes.
        # Unprivileged: bwrap uses a user namespace; the process limit would count all of our own processes,
        # so it is left to the timeout.
        cmd = [*rlimit_argv(self.limits, cpu_seconds, nproc=self.limits.pids_limit if self.privileged else None)]
        cmd += [self.exe, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.privileged:
            cmd += ["--unshare-user", "--cap-drop", "ALL"]
        cmd += ["--die-with-parent", "--new-session"]
        cmd += root_binds(self.hidden)
        cmd += ["--dev", "/dev", "--proc", "/proc"]
        for h in self.hidden:
            if h != "/tmp":
                cmd += ["--tmpfs", h]
        # /tmp first: the interpreter (a venv in a checkout under /tmp, e.g. CI's) may need binding back below it.
        cmd += ["--size", str(64 * mib), "--tmpfs", "/tmp"]
        for p in self.ro_binds:
            # directories bwrap creates on the way are 0700: make them traversable for the sandbox's uid
            parent = os.path.dirname(p)
            ancestors = []
            while parent not in ("/", "") and not any(parent == h for h in self.hidden):
                ancestors.append(parent)
                parent = os.path.dirname(parent)
            for a in reversed(ancestors):
                cmd += ["--perms", "0755", "--dir", a]
            cmd += ["--ro-bind", p, p]
        cmd += ["--bind", self.host_workspace, self.workspace, "--remount-ro", "/", "--chdir", cwd]
        for fd in extra_fds:
            cmd += ["--json-status-fd", str(fd)]
        cmd.append("--")
        if self.privileged and self.uid is not None:
            cmd += [
                self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            ]
        return [*cmd, *argv]

    def timeout_probe(self, proc: subprocess.Popen) -> dict[str, Any]:
        if self.uid is None:
            return {}
        count = count_uid_processes(self.uid)
        return {"processes": count, "pids_exhausted": count >= self.limits.pids_limit}

    def interpret(
        self,
        argv: list[str],
        outcome: _proc.RunOutcome,
        timeout: float,
        timeout_cause: Any,
        status: bytes,
        probe: dict[str, Any],
    ) -> ExecResult:
        if not outcome.timed_out:
            events = _status_events(status)
            if not any("exit-code" in e for e in events):
                stderr = outcome.stderr.decode(errors="replace").strip()
                if stderr.startswith("bwrap:") or not any("child-pid" in e for e in events):
                    raise self._fail(FailureCause.SETUP, f"bwrap could not set up the sandbox: {stderr[-500:]}")
                raise self._fail(
                    FailureCause.CRASH, f"the sandbox of {argv[0]!r} died (bwrap exit {outcome.returncode})"
                )
        return super().interpret(argv, outcome, timeout, timeout_cause, status, probe)

    def _cleanup(self) -> None:
        super()._cleanup()
        if self.uid is not None:
            # Anything left running under this sandbox's uid dies with it.
            kill_uid_processes(self.uid)


def root_binds(hidden: Sequence[str]) -> list[str]:
    """The host's root, read-only, one top-level entry at a time on the sandbox's own (read-only) root: that
    leaves room for mount points such as /workspace that the host does not have."""
    args: list[str] = []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in ("proc", "dev") or path in hidden:
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path) or os.path.isfile(path):
            args += ["--ro-bind", path, path]
    return args


def _status_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for line in raw.decode(errors="replace").splitlines():
        line = line.strip()
        if line:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _uid_pids(uid: int) -> list[int]:
    """Live processes of ``uid``. Zombies are left out: they are dead, and once their sandbox's init is gone
    they wait to be reaped by the host's init, which can take a while in a container."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                state = b""
                for line in f:
                    if line.startswith(b"State:"):
                        state = line.split()[1]
                    elif line.startswith(b"Uid:"):  # State comes before Uid in /proc/PID/status
                        if int(line.split()[1]) == uid and state not in (b"Z", b"X"):
                            pids.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return pids


def count_uid_processes(uid: int) -> int:
    return len(_uid_pids(uid))


def kill_uid_processes(uid: int) -> None:
    import signal

    for pid in _uid_pids(uid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
