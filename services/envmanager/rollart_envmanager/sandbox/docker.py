"""Docker sandboxes: one container per episode from a locally built image (nothing is pulled).

Containers run with no network, a read-only root, a size-limited tmpfs workspace, memory (no swap), CPU and
PID limits, no capabilities, ``no-new-privileges`` and an unprivileged user. The container's main process
sleeps for the time budget (so a leaked container ends by itself); commands run with ``docker exec``.
A command that overruns its timeout gets the whole container killed: a process inside cannot be killed
reliably from outside otherwise, so the sandbox is finished after a timeout.

Images are built from files on this machine: ``busybox_image()`` is ``FROM scratch`` with Debian's static
busybox; ``python_image()`` adds this interpreter's standard library, its shared libraries and pytest.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _proc
from .base import DOCKER, ExecResult, Sandbox, SandboxLimits, classify_signal, classify_stderr, signal_name
from .errors import FailureCause, SandboxFailure

IMAGE_BUILDER_VERSION = "2"
SANDBOX_USER = "65534:65534"
_build_lock = threading.Lock()


def docker_cli() -> str | None:
    return shutil.which("docker")


def _docker(args: Sequence[str], *, timeout: float = 60, input: bytes | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = docker_cli()
    if exe is None:
        raise SandboxFailure(FailureCause.UNAVAILABLE, "the docker CLI is not installed", backend=DOCKER)
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        return subprocess.run(
            [exe, *args], input=input, capture_output=True, timeout=timeout, env=full_env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SandboxFailure(
            FailureCause.UNAVAILABLE, f"docker {args[0]} did not answer within {timeout:g}s", backend=DOCKER
        ) from exc


def availability(refresh: bool = False) -> tuple[bool, str]:
    """(works, reason): a docker CLI and a daemon that answers."""
    if refresh:
        _availability.cache_clear()
    return _availability()


@functools.lru_cache(maxsize=1)
def _availability() -> tuple[bool, str]:
    if docker_cli() is None:
        return False, "the docker CLI is not installed (Debian package docker.io)"
    try:
        res = _docker(["version", "--format", "{{.Server.Version}}"], timeout=15)
    except SandboxFailure as exc:
        return False, exc.message
    if res.returncode != 0:
        return False, "no docker daemon answers: " + res.stderr.decode(errors="replace").strip()[-300:]
    return True, ""


def start_daemon(log_path: str, timeout: float = 30.0) -> subprocess.Popen | None:
    """Starts ``dockerd`` (as root) when none answers; returns its process (None: one already answers).

    It runs without a default bridge and without touching iptables: sandboxes use ``--network none`` only.
    """
    ok, _ = availability(refresh=True)
    if ok:
        return None
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise SandboxFailure(FailureCause.UNAVAILABLE, "dockerd is not installed", backend=DOCKER)
    if os.geteuid() != 0:
        raise SandboxFailure(FailureCause.UNAVAILABLE, "starting dockerd needs root", backend=DOCKER)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [dockerd, "--bridge=none", "--iptables=false", "--ip-masq=false"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = Path(log_path).read_text(errors="replace").splitlines()[-5:]
            raise SandboxFailure(
                FailureCause.UNAVAILABLE, f"dockerd exited with {proc.returncode}: {' | '.join(tail)}", backend=DOCKER
            )
        if availability(refresh=True)[0]:
            return proc
        time.sleep(0.5)
    _proc.kill_group(proc)
    raise SandboxFailure(FailureCause.UNAVAILABLE, f"dockerd did not answer within {timeout:g}s", backend=DOCKER)


def stop_daemon(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Stops a daemon started by :func:`start_daemon` (SIGTERM to its process group, then SIGKILL)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _proc.kill_group(proc)
        proc.wait()
    availability(refresh=True)


# -- images ---------------------------------------------------------------------------------------------------------
def _is_static_elf(path: str) -> bool:
    """True for an ELF executable without an interpreter (PT_INTERP), i.e. statically linked."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
            return False
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def find_static_busybox() -> str:
    for cand in (os.environ.get("ROLLART_BUSYBOX", ""), "/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if cand and os.path.isfile(cand) and _is_static_elf(cand):
            return cand
    raise SandboxFailure(
        FailureCause.SETUP, "no static busybox found (install Debian's busybox-static)", backend=DOCKER
    )


def image_exists(tag: str) -> bool:
    return _docker(["image", "inspect", tag], timeout=30).returncode == 0


def build_image(tag: str, context: str) -> None:
    # The legacy builder: no BuildKit/buildx needed, and no RUN steps (FROM scratch + COPY only).
    res = _docker(["build", "--network", "none", "-t", tag, context], timeout=600, env={"DOCKER_BUILDKIT": "0"})
    if res.returncode != 0:
        raise SandboxFailure(
            FailureCause.SETUP, f"building {tag} failed: {res.stderr.decode(errors='replace')[-800:]}", backend=DOCKER
        )


def _busybox_rootfs(root: Path, busybox: str) -> None:
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, check=True).stdout.decode().split()
    for name in applets:
        if name != "busybox" and not (root / "bin" / name).exists():
            os.symlink("busybox", root / "bin" / name)
    for d in ("tmp", "workspace", "etc", "proc", "sys", "dev"):
        (root / d).mkdir(exist_ok=True)
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/workspace:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")


def _write_dockerfile(context: Path) -> None:
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/bin\nWORKDIR /workspace\nCMD [\"/bin/sh\"]\n"
    )


def busybox_image() -> str:
    """Tag of a ``FROM scratch`` image holding only a static busybox (built once, cached by content)."""
    busybox = find_static_busybox()
    digest = hashlib.sha256(Path(busybox).read_bytes() + IMAGE_BUILDER_VERSION.encode()).hexdigest()[:12]
    tag = f"rollart-sandbox-busybox:{digest}"
    with _build_lock:
        if not image_exists(tag):
            with tempfile.TemporaryDirectory(prefix="rollart-image-") as tmp:
                ctx = Path(tmp)
                _busybox_rootfs(ctx / "rootfs", busybox)
                _write_dockerfile(ctx)
                build_image(tag, str(ctx))
    return tag


# Standard-library parts a test run does not need (tests, GUI, packaging tools, the build config).
_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "__phello__"}
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "pytest_timeout", "py")
PYTEST_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments", "pytest-timeout")
PYTHON_IN_IMAGE = "/usr/local/bin/python3"


def _needed_libs(binaries: Sequence[str]) -> set[str]:
    libs: set[str] = set()
    for binary in binaries:
        res = subprocess.run(["ldd", binary], capture_output=True, check=False)
        for line in res.stdout.decode(errors="replace").splitlines():
            parts = line.split()
            if "=>" in parts:
                i = parts.index("=>")
                if i + 1 < len(parts) and parts[i + 1].startswith("/"):
                    libs.add(parts[i + 1])
            elif parts and parts[0].startswith("/"):
                libs.add(parts[0])
    return libs


def _site_packages() -> Path:
    import pytest

    return Path(pytest.__file__).resolve().parents[1]


def python_image() -> str:
    """Tag of an image with busybox, this Python's standard library and pytest (built once, cached)."""
    busybox = find_static_busybox()
    prefix = Path(sys.base_prefix).resolve()
    site = _site_packages()
    versions = []
    for pkg in PYTEST_PACKAGES:
        if (site / pkg).is_dir() or (site / f"{pkg}.py").is_file():
            versions.append(pkg)
    from importlib import metadata

    meta = [f"{d}=={metadata.version(d)}" for d in PYTEST_DISTS if _has_dist(d)]
    key = "|".join([IMAGE_BUILDER_VERSION, sys.version, str(prefix), *meta,
                    hashlib.sha256(Path(busybox).read_bytes()).hexdigest()])
    tag = f"rollart-sandbox-python:{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    with _build_lock:
        if image_exists(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="rollart-image-") as tmp:
            ctx = Path(tmp)
            root = ctx / "rootfs"
            _busybox_rootfs(root, busybox)
            stdlib = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
            dest_std = root / stdlib.relative_to("/")

            def ignore(d: str, names: list[str]) -> set[str]:
                skip = {n for n in names if n.endswith((".opt-1.pyc", ".opt-2.pyc"))}
                if Path(d) == stdlib:
                    skip |= {n for n in names if n in _STDLIB_SKIP or n.startswith("config-")}
                return skip

            shutil.copytree(stdlib, dest_std, ignore=ignore, symlinks=True)
            dest_site = dest_std / "site-packages"
            dest_site.mkdir()
            for pkg in versions:
                src = site / pkg
                if src.is_dir():
                    shutil.copytree(src, dest_site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(site / f"{pkg}.py", dest_site / f"{pkg}.py")
            # dist-info too: pytest loads plugins (pytest-timeout) through their entry points
            wanted = {d.replace("-", "_").lower() for d in PYTEST_DISTS}
            for entry in site.iterdir():
                if entry.name.endswith(".dist-info") and entry.name.split("-")[0].lower() in wanted:
                    shutil.copytree(entry, dest_site / entry.name)
            exe = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
            (root / exe.parent.relative_to("/")).mkdir(parents=True, exist_ok=True)
            shutil.copy2(exe, root / exe.relative_to("/"))
            libdir = prefix / "lib"
            for so in libdir.glob("libpython*.so*"):
                target = root / so.relative_to("/")
                if so.is_symlink():
                    os.symlink(os.readlink(so), target)
                else:
                    shutil.copy2(so, target)
            binaries = [str(exe), *map(str, (stdlib / "lib-dynload").glob("*.so"))]
            (root / "lib").mkdir(exist_ok=True)
            (root / "lib64").mkdir(exist_ok=True)
            for lib in _needed_libs(binaries):
                if lib.startswith(str(prefix)):
                    continue
                real = os.path.realpath(lib)
                if os.path.basename(lib).startswith("ld-linux"):
                    shutil.copy2(real, root / "lib64" / os.path.basename(lib))
                else:
                    shutil.copy2(real, root / "lib" / os.path.basename(lib))
            (root / "usr" / "local" / "bin").mkdir(parents=True)
            for name in ("python3", "python"):
                os.symlink(str(exe), root / "usr" / "local" / "bin" / name)
            _write_dockerfile(ctx)
            build_image(tag, str(ctx))
    return tag


def _has_dist(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


# -- the sandbox ----------------------------------------------------------------------------------------------------
_CGROUP_DIRS = (
    "/sys/fs/cgroup/{ctl}/docker/{cid}",
    "/sys/fs/cgroup/{ctl}/system.slice/docker-{cid}.scope",
    "/sys/fs/cgroup/system.slice/docker-{cid}.scope",
    "/sys/fs/cgroup/docker/{cid}",
)


class DockerSandbox(Sandbox):
    backend = DOCKER
    supports_spawn = False
    workspace = "/workspace"

    def __init__(self, limits: SandboxLimits | None = None, *, sandbox_id: str | None = None,
                 image: str | None = None, python: bool = True, user: str = SANDBOX_USER,
                 extra_args: Sequence[str] = ()) -> None:
        super().__init__(limits, sandbox_id=sandbox_id)
        self.image = image
        self.want_python = python
        self.python = PYTHON_IN_IMAGE if python or image else "python3"
        self.user = user
        self.extra_args = list(extra_args)
        self.container_id: str | None = None

    def run_args(self, image: str) -> list[str]:
        lim = self.limits
        mib = 1024 * 1024
        ws = f"/workspace:rw,exec,size={lim.workspace_mib}m,mode=0755"
        uid, _, gid = self.user.partition(":")
        if uid.isdigit():
            ws += f",uid={uid},gid={gid or uid}"
        args = [
            "run", "-d",
            "--name", f"rollart-{self.id}",
            "--label", "rollart.sandbox=1",
            "--label", f"rollart.sandbox.id={self.id}",
            "--network", "none",
            "--memory", f"{lim.memory_mib}m",
            "--memory-swap", f"{lim.memory_mib}m",
            "--cpus", f"{lim.cpu_limit:g}",
            "--pids-limit", str(lim.pids_limit),
            "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--user", self.user,
            "--ipc", "private",
            "--hostname", "sandbox",
            "--tmpfs", ws,
            "--tmpfs", "/tmp:rw,exec,size=64m,mode=1777",
            "--ulimit", f"fsize={min(lim.file_size_mib, lim.workspace_mib) * mib}",
            "--ulimit", f"nofile={lim.open_files}:{lim.open_files}",
            "--ulimit", "core=0",
            "--workdir", self.workspace,
        ]
        if not lim.writable_root:
            args.append("--read-only")
        # The main process sleeps out the budget (plus slack): a container nobody removes still ends.
        sleep_s = int(lim.time_budget_s) + 60
        return [*args, *self.extra_args, "--entrypoint", "/bin/sleep", image, str(sleep_s)]

    def _start(self) -> None:
        ok, reason = availability()
        if not ok:
            raise SandboxFailure(FailureCause.UNAVAILABLE, reason, backend=DOCKER)
        image = self.image or (python_image() if self.want_python else busybox_image())
        self.image = image
        res = _docker(self.run_args(image), timeout=60)
        if res.returncode != 0:
            raise SandboxFailure(
                FailureCause.SETUP, f"docker run failed: {res.stderr.decode(errors='replace')[-500:]}", backend=DOCKER
            )
        self.container_id = res.stdout.decode().strip()

    def _cleanup(self) -> None:
        if self.container_id:
            _docker(["rm", "-f", self.container_id], timeout=60)
            self.container_id = None

    def _cgroup_value(self, controller: str, filename: str) -> str | None:
        if not self.container_id:
            return None
        for pattern in _CGROUP_DIRS:
            path = os.path.join(pattern.format(ctl=controller, cid=self.container_id), filename)
            try:
                with open(path) as f:
                    return f.read()
            except OSError:
                continue
        return None

    def oom_kills(self) -> int | None:
        for ctl, name in (("memory", "memory.oom_control"), ("memory", "memory.events")):
            raw = self._cgroup_value(ctl, name)
            if raw is None:
                continue
            for line in raw.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "oom_kill":
                    return int(parts[1])
        return None

    def pids_current(self) -> int | None:
        raw = self._cgroup_value("pids", "pids.current")
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    def _workspace_full(self) -> bool:
        res = _docker(["exec", self.container_id or "-", "df", "-k", self.workspace], timeout=30)
        lines = res.stdout.decode(errors="replace").split("\n")
        try:
            available = int(lines[1].split()[3])
        except (IndexError, ValueError):
            return False
        return available < 256

    def _running(self) -> bool:
        res = _docker(["inspect", "-f", "{{.State.Running}}", self.container_id or "-"], timeout=30)
        return res.returncode == 0 and res.stdout.decode().strip() == "true"

    def _exec(
        self, argv: list[str], *, input: bytes | None, timeout: float | None, cwd: str | None, env: dict[str, str]
    ) -> ExecResult:
        assert self.container_id is not None
        call_timeout, timeout_cause = self.call_timeout(timeout)
        exe = docker_cli() or "docker"
        args = [exe, "exec"]
        if input is not None:
            args.append("-i")
        workdir = cwd if cwd and cwd.startswith("/") else os.path.join(self.workspace, cwd or "")
        args += ["-w", workdir.rstrip("/") or "/", "--user", self.user]
        for k, v in {"HOME": self.workspace, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **env}.items():
            args += ["-e", f"{k}={v}"]
        args += [self.container_id, *argv]
        oom_before = self.oom_kills()
        probe: dict[str, Any] = {}
        outcome = _proc.run(
            args, input=input, timeout=call_timeout, env=dict(os.environ),
            on_timeout=lambda p: probe.update(pids=self.pids_current()),
        )
        if outcome.timed_out:
            # The process inside survives its docker-exec client: the container goes.
            _docker(["kill", self.container_id], timeout=30)
            pids = probe.get("pids")
            forks_failed = classify_stderr(outcome.stderr) is FailureCause.PIDS
            if forks_failed or (pids is not None and pids >= self.limits.pids_limit):
                cause, what = FailureCause.PIDS, f"hit the process limit ({self.limits.pids_limit})"
            else:
                cause = timeout_cause
                what = "ran past its " + ("time budget" if cause is FailureCause.BUDGET else "step timeout")
            failure = self._fail(cause, f"{argv[0]!r} {what} ({call_timeout:.1f}s); container killed", **probe)
            self.failure = failure  # the container is gone
            raise failure
        rc = outcome.returncode
        stderr = outcome.stderr
        if rc in (125, 126, 127) and b"Error response from daemon" in stderr:
            running = self._running()
            failure = self._fail(
                FailureCause.CRASH if not running else FailureCause.SETUP,
                f"docker exec failed: {stderr.decode(errors='replace').strip()[-300:]}",
            )
            if not running:
                self.failure = failure
            raise failure
        if rc == 137 or rc == -9:
            oom_after = self.oom_kills()
            if oom_after is None or oom_before is None or oom_after > oom_before:
                raise self._fail(
                    FailureCause.MEMORY,
                    f"{argv[0]!r} was killed by the OOM killer (memory limit {self.limits.memory_mib} MiB)",
                    oom_kills=oom_after,
                )
        sig = -rc if rc < 0 else (rc - 128 if 128 < rc < 160 else 0)
        if sig:
            killed_by = classify_signal(sig)
            if killed_by is not None:
                raise self._fail(killed_by, f"{argv[0]!r} was killed by {signal_name(sig)}", signal=sig)
        if rc != 0 and b"I/O error" in stderr[-4096:] and self._workspace_full():
            # busybox reports a full tmpfs as a plain I/O error
            tail = stderr[-200:].decode(errors="replace")
            raise self._fail(FailureCause.WORKSPACE, f"workspace is full ({self.limits.workspace_mib} MiB): {tail}")
        if rc != 0 and not self._running():
            failure = self._fail(FailureCause.CRASH, "the container stopped during the command")
            self.failure = failure
            raise failure
        return ExecResult(argv=argv, exit_code=rc, stdout=outcome.stdout, stderr=stderr,
                          duration_s=outcome.duration_s, truncated=outcome.truncated)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image": self.image, "container": self.container_id}
