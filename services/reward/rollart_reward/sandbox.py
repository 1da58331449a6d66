"""Running untrusted code under bubblewrap: no network, read-only host, a private writable workspace, limits.

Every run gets: new network, pid, ipc and uts namespaces (``--unshare-net --unshare-pid ...``), the host's
root bound read-only, a tmpfs ``/tmp`` with the workspace bound at ``/tmp/ws``, ``--die-with-parent`` (a killed
worker takes its sandboxes with it), a cleared environment, rlimits (address space, CPU seconds, file size,
processes, open files, no core dumps) and a fresh non-root uid, then a wall-clock budget after which the whole
process group is SIGKILLed. Directories on the way to the Python installation that only root may enter (e.g.
``/root`` under pyenv) are masked with a tmpfs holding just the installation, so root's files stay hidden.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

WS = "/tmp/ws"  # the workspace as the sandboxed code sees it
LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
MiB = 1024 * 1024


@dataclass
class SandboxLimits:
    bwrap: str = "bwrap"
    memory_mb: int = 1024
    # CPU seconds (RLIMIT_CPU); None: the wall-clock budget rounded up, plus one.
    cpu_seconds: float | None = None
    file_size_mb: int = 16
    max_processes: int = 64
    open_files: int = 256
    # Each run gets a uid in [uid_base, uid_base + uid_span): RLIMIT_NPROC counts per uid, so runs do not
    # share one process budget.
    uid_base: int = 200_000
    uid_span: int = 100_000
    workdir: str | None = None
    output_tail_bytes: int = 4000


@dataclass
class SandboxRun:
    exit_code: int | None
    timed_out: bool
    wall_seconds: float
    output_tail: str
    report: dict | None = None
    budget: float = 0.0
    # The most processes the run had at once (sampled), and its limit: a run at the limit was a fork bomb.
    peak_processes: int = 0
    max_processes: int = 0

    @property
    def signal(self) -> int | None:
        """The signal that ended the command (bwrap reports it as 128 + signal number)."""
        if self.exit_code is not None and self.exit_code > 128:
            return self.exit_code - 128
        return None


class SandboxUnavailable(RuntimeError):
    pass


WS_PREFIX = "rollart-sbx-"


def sweep_stale(workdir: str | None) -> int:
    """Remove workspaces left by worker processes that were killed mid-run (named after the worker's pid)."""
    base = Path(workdir or tempfile.gettempdir())
    removed = 0
    for path in base.glob(f"{WS_PREFIX}*-*"):
        pid = path.name[len(WS_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its worker is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _traversable_by_others(path: Path) -> bool:
    try:
        return bool(path.stat().st_mode & stat.S_IXOTH)
    except OSError:
        return False


def exposure_args(paths: list[str]) -> list[str]:
    """bwrap arguments that make ``paths`` readable to a non-root uid even under root-only directories."""
    masks: list[Path] = []
    binds: list[Path] = []
    for raw in sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}, key=len):
        p = Path(raw)
        blocked = next((a for a in reversed(p.parents) if a != Path("/") and not _traversable_by_others(a)), None)
        if blocked is None:
            continue
        if any(p == b or b in p.parents for b in binds):
            continue
        if blocked not in masks:
            masks.append(blocked)
        binds.append(p)
    args: list[str] = []
    for m in masks:
        args += ["--tmpfs", str(m)]
    made: set[Path] = set()
    for b in binds:
        mask = next(m for m in masks if m in b.parents)
        between = [a for a in reversed(b.parents) if mask in a.parents]
        for d in between:
            if d not in made:
                made.add(d)
                args += ["--perms", "0755", "--dir", str(d)]
        args += ["--ro-bind", str(b), str(b)]
    return args


def tmp_binds(paths: list[str]) -> list[str]:
    """Read-only binds for the given paths that lie under /tmp (outermost only), with their parents made."""
    under = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}, key=len)
    keep: list[Path] = []
    for raw in under:
        p = Path(raw)
        if Path("/tmp") in p.parents and not any(k == p or k in p.parents for k in keep):
            keep.append(p)
    args: list[str] = []
    made: set[Path] = set()
    for b in keep:
        for d in [a for a in reversed(b.parents) if Path("/tmp") in a.parents]:
            if d not in made:
                made.add(d)
                args += ["--perms", "0755", "--dir", str(d)]
        args += ["--ro-bind", str(b), str(b)]
    return args


def python_paths() -> list[str]:
    """What the sandboxed interpreter must be able to read: the installation, the venv, the import path."""
    paths = [sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    paths.append(str(LAUNCHER.parent))
    return paths


def rlimits(limits: SandboxLimits, budget: float) -> dict[str, tuple[int, int]]:
    cpu = limits.cpu_seconds if limits.cpu_seconds is not None else math.ceil(budget) + 1
    cpu = max(1, math.ceil(cpu))
    return {
        "RLIMIT_AS": (limits.memory_mb * MiB, limits.memory_mb * MiB),
        # Soft limit sends SIGXCPU (reported as cpu_limit), the hard one a SIGKILL a second later.
        "RLIMIT_CPU": (cpu, cpu + 1),
        "RLIMIT_FSIZE": (limits.file_size_mb * MiB, limits.file_size_mb * MiB),
        "RLIMIT_NPROC": (limits.max_processes, limits.max_processes),
        "RLIMIT_NOFILE": (limits.open_files, limits.open_files),
        "RLIMIT_CORE": (0, 0),
    }


def bwrap_argv(host_ws: str, limits: SandboxLimits, uid: int, argv: list[str], env: dict[str, str], budget: float):
    bwrap = shutil.which(limits.bwrap)
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap ({limits.bwrap!r}) is not installed")
    spec = {"rlimits": rlimits(limits, budget), "uid": uid, "argv": argv, "env": env}
    return [
        bwrap,
        "--ro-bind", "/", "/",
        *exposure_args(python_paths()),
        "--dev", "/dev",
        "--proc", "/proc",
        "--size", str(64 * MiB), "--tmpfs", "/tmp",
        # An interpreter living under /tmp (a checkout there, e.g. CI's) is bound back after the tmpfs hid it.
        *tmp_binds(python_paths()),
        "--bind", host_ws, WS,
        "--chdir", WS,
        "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--",
        sys.executable, "-I", str(LAUNCHER), json.dumps(spec),
    ]  # fmt: skip


def count_processes(uid: int) -> int:
    """Processes (and threads' leaders) whose real uid is ``uid``: each sandbox run has its own uid."""
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    n += 1
            except OSError:
                continue
    return n


def _drain(proc: subprocess.Popen, deadline: float, keep: int, uid: int) -> tuple[bytes, bool, int]:
    """Read the combined output until the process ends or the deadline passes; keep only the last ``keep`` bytes.

    Also returns the most processes the sandbox's uid had at once (sampled while the run is quiet and at the
    deadline), which tells a fork bomb from a plain infinite loop.
    """
    tail = bytearray()
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = False
    peak = 0
    next_sample = time.monotonic() + 0.5
    try:
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                timed_out = True
                peak = max(peak, count_processes(uid))
                break
            if now >= next_sample:
                peak = max(peak, count_processes(uid))
                next_sample = now + 0.5
            if not sel.select(timeout=min(left, 0.25)):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            tail += chunk
            if len(tail) > 2 * keep:
                del tail[:-keep]
    finally:
        sel.close()
    if timed_out:
        _kill(proc)
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 2.0)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    return bytes(tail[-keep:]), timed_out, peak


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap's session: its pid-1 dies and takes the namespace with it
    except ProcessLookupError:
        pass


def run(
    files: dict[str, str], argv: list[str], limits: SandboxLimits, budget: float, env: dict[str, str]
) -> SandboxRun:
    """Write ``files`` into a fresh workspace and run ``argv`` there in the sandbox for at most ``budget`` s."""
    host_ws = tempfile.mkdtemp(prefix=f"{WS_PREFIX}{os.getpid()}-", dir=limits.workdir)
    uid = limits.uid_base + secrets.randbelow(limits.uid_span)
    try:
        for name, content in files.items():
            path = Path(host_ws) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            path.chmod(0o644)
        scratch = Path(host_ws) / ".tmp"
        scratch.mkdir()
        os.chmod(host_ws, 0o755)
        if os.getuid() == 0:
            os.chown(host_ws, uid, uid)
            os.chown(scratch, uid, uid)
        full_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": WS,
            "TMPDIR": f"{WS}/.tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            **env,
        }
        cmd = bwrap_argv(host_ws, limits, uid, argv, full_env, budget)
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        tail, timed_out, peak = _drain(proc, start + budget, limits.output_tail_bytes, uid)
        wall = time.monotonic() - start
        report = None
        report_path = Path(host_ws) / ".report.json"
        # Never follow a link the sandboxed code may have planted (this process runs as root).
        if report_path.is_file() and not report_path.is_symlink():
            try:
                with report_path.open("rb") as fh:
                    report = parse_report(fh.read(4 * MiB).decode(errors="replace"))
            except OSError:
                report = None
        return SandboxRun(
            exit_code=proc.returncode,
            timed_out=timed_out,
            wall_seconds=wall,
            output_tail=tail.decode(errors="replace"),
            report=report if isinstance(report, dict) else None,
            budget=budget,
            peak_processes=peak,
            max_processes=limits.max_processes,
        )
    finally:
        shutil.rmtree(host_ws, ignore_errors=True)


# The report plugin, loaded by pytest from the workspace's conftest.py. It appends one JSON line per result as it
# happens (so a run killed at its time budget still tells what went wrong first), and only from the first pytest
# process: a forked child that runs on through pytest must not add to it.
REPORT_CONFTEST = """
import json, os
_PID = os.getpid()


def _emit(item):
    if os.getpid() != _PID:
        return
    with open(os.environ["ROLLART_REPORT"], "a") as fh:
        fh.write(json.dumps(item) + "\\n")


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)[-2000:]
    return str(report.longrepr or "")[-2000:]


def pytest_collectreport(report):
    if report.failed:
        _emit({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "message": _message(report)})


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _emit({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "message": _message(report)})


def pytest_sessionfinish(session, exitstatus):
    _emit({"exitstatus": int(exitstatus)})
"""


def parse_report(text: str) -> dict:
    """{"exitstatus": int or None (session did not finish), "tests": [...]} from the JSON-lines report."""
    tests: list[dict] = []
    exitstatus = None
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if "exitstatus" in item:
            exitstatus = int(item["exitstatus"])
        elif "outcome" in item:
            tests.append({k: str(item.get(k, "")) for k in ("nodeid", "when", "outcome", "message")})
    return {"exitstatus": exitstatus, "tests": tests}


def run_pytest(
    solution: str,
    tests: str,
    limits: SandboxLimits,
    budget: float,
    *,
    module: str = "solution",
    test_file: str = "test_solution.py",
    extra_files: dict[str, str] | None = None,
) -> SandboxRun:
    files = dict(extra_files or {})
    files.update(
        {
            f"{module}.py": solution,
            test_file: tests,
            "conftest.py": REPORT_CONFTEST,
            "pytest.ini": "[pytest]\naddopts = -p no:cacheprovider\n",
        }
    )
    argv = [sys.executable, "-I", "-m", "pytest", "-q", "--no-header", "-rN", test_file]
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "ROLLART_REPORT": f"{WS}/.report.json"}
    return run(files, argv, limits, budget, env)
