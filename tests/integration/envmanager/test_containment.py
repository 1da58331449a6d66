"""Sandbox containment on bwrap and Docker: network, files outside the workspace, host secrets, fork bomb,
memory bomb, infinite loop, file size, workspace size, time budget. Each escape attempt either fails inside
the sandbox or ends as a SandboxFailure with its cause (never as a result that looks fine)."""

import os
import sys
import time
from pathlib import Path

import pytest

from rollart_envmanager.sandbox import FailureCause, SandboxFailure, SandboxLimits, availability, make_sandbox
from rollart_envmanager.sandbox.bwrap import count_uid_processes

BWRAP = availability("bwrap")
BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not BWRAP[0], reason=f"bwrap unavailable: {BWRAP[1]}")),
    "docker",
]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_python_image")
    return request.param


@pytest.fixture
def sandbox(backend, small_limits):
    sb = make_sandbox(backend, small_limits).start()
    yield sb
    sb.close()


def failure(sb, argv, **kw) -> SandboxFailure:
    with pytest.raises(SandboxFailure) as err:
        sb.exec(argv, **kw)
    return err.value


def test_no_network(sandbox, loopback_server):
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(2)\n"
        f"s.connect(('127.0.0.1', {loopback_server}))\n"
        "print(s.recv(100))\n"
    )
    r = sandbox.exec([sandbox.python, "-c", probe], classify=False)
    assert r.exit_code != 0 and b"host-secret" not in r.stdout
    assert b"ConnectionRefused" in r.stderr or b"Network is unreachable" in r.stderr
    devs = sandbox.exec(["cat", "/proc/net/dev"]).stdout.decode()
    interfaces = {line.split(":")[0].strip() for line in devs.splitlines()[2:] if ":" in line}
    assert interfaces <= {"lo"}


def test_writes_outside_the_workspace_fail(sandbox):
    marker = f"rollart-escape-{os.getpid()}"
    r = sandbox.exec(["sh", "-c", f"echo x > /etc/{marker}; echo x > /{marker}; echo x > /usr/{marker}; "
                                  f"echo ok > {sandbox.workspace}/inside; cat {sandbox.workspace}/inside"])
    assert r.stdout.strip() == b"ok"
    assert r.stderr.count(b"Read-only file system") + r.stderr.count(b"Permission denied") >= 3
    for path in (f"/etc/{marker}", f"/{marker}", f"/usr/{marker}"):
        assert not os.path.exists(path)
    # files written earlier are still there: the workspace persists across commands
    assert sandbox.read_file("inside") == b"ok\n"


def test_host_secrets_and_control_sockets_are_hidden(sandbox):
    r = sandbox.exec(["sh", "-c", "id -u; ls -A /root"])
    lines = r.stdout.decode().split()
    assert lines[0] != "0"  # never root inside
    assert set(lines[1:]) <= {".pyenv"}  # at most the Python installation, bound back read-only
    assert sandbox.exec(["sh", "-c", "test -e /var/run/docker.sock || test -e /run/docker.sock"]).exit_code != 0
    # the host's /home and /tmp are not visible (empty or absent inside), except the interpreter itself when the
    # checkout lives under /tmp (bound back read-only)
    allowed = {Path(p).relative_to("/tmp").parts[0] for p in {os.path.realpath(sys.prefix)} if p.startswith("/tmp/")}
    seen = sandbox.exec(["sh", "-c", "ls -A /home /tmp 2>/dev/null | grep -v ':$' | grep ."]).stdout.decode().split()
    assert set(seen) <= allowed


def test_fork_bomb(sandbox):
    f = failure(sandbox, [sandbox.python, "-c", "import os\nwhile True:\n    os.fork()"])
    assert f.cause is FailureCause.PIDS
    f = failure(sandbox, ["sh", "-c", "f() { f | f & }; f; sleep 30"])
    assert f.cause is FailureCause.PIDS


def test_memory_bomb(sandbox):
    f = failure(sandbox, [sandbox.python, "-c", "x = []\nwhile True:\n    x.append(bytearray(16 << 20))"])
    assert f.cause is FailureCause.MEMORY


def test_infinite_loop(backend, small_limits):
    with make_sandbox(backend, small_limits) as sb:
        t0 = time.monotonic()
        f = failure(sb, ["sh", "-c", "while true; do :; done"])
        assert f.cause is FailureCause.TIMEOUT and time.monotonic() - t0 < small_limits.step_timeout_s + 3


def test_file_size_limit(sandbox):
    f = failure(sandbox, ["sh", "-c", "head -c 10000000 /dev/zero > big"])
    assert f.cause is FailureCause.FILE_SIZE


def test_workspace_size_limit(sandbox):
    # each file under the per-file limit, together over the workspace's 16 MiB
    f = failure(sandbox, ["sh", "-c", "for i in 1 2 3 4 5 6; do head -c 3500000 /dev/zero > f$i || exit 1; done"])
    assert f.cause is FailureCause.WORKSPACE


def test_time_budget(backend):
    with make_sandbox(backend, SandboxLimits(time_budget_s=2, step_timeout_s=30)) as sb:
        f = failure(sb, ["sleep", "10"])
        assert f.cause is FailureCause.BUDGET
        with pytest.raises(SandboxFailure):
            sb.exec(["true"])


@pytest.mark.skipif(not BWRAP[0], reason=f"bwrap unavailable: {BWRAP[1]}")
def test_bwrap_processes_do_not_outlive_their_command(small_limits):
    with make_sandbox("bwrap", small_limits) as sb:
        sb.exec(["sh", "-c", "sleep 60 & sleep 60 & echo started"])
        # The pid namespace died with the command; the kernel SIGKILLs its members asynchronously (one can still
        # show as running for a few milliseconds), so give it a moment, not a minute.
        deadline = time.monotonic() + 2.0
        while count_uid_processes(sb.uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert count_uid_processes(sb.uid) == 0
        sb.exec(["sh", "-c", "touch a b c"])
        assert sorted(sb.exec(["ls"]).stdout.split()) == [b"a", b"b", b"c"]


@pytest.mark.skipif(not BWRAP[0], reason=f"bwrap unavailable: {BWRAP[1]}")
def test_bwrap_setup_failure_is_typed(small_limits):
    from rollart_envmanager.sandbox.bwrap import BwrapSandbox

    sb = BwrapSandbox(small_limits, extra_ro_binds=["/no/such/dir"])
    with pytest.raises(SandboxFailure) as err:
        with sb:
            sb.exec(["true"])
    assert err.value.cause is FailureCause.SETUP


def test_docker_container_is_locked_down(docker_python_image, small_limits):
    from rollart_envmanager.sandbox import docker as dk

    with make_sandbox("docker", small_limits) as sb:
        info = dk._docker(["inspect", sb.container_id], timeout=30).stdout
        import json

        host = json.loads(info)[0]["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["Memory"] == small_limits.memory_mib << 20 and host["MemorySwap"] == host["Memory"]
        assert host["PidsLimit"] == small_limits.pids_limit and host["NanoCpus"] == int(small_limits.cpu_limit * 1e9)
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        cid = sb.container_id
    # closed: the container is gone
    assert dk._docker(["inspect", cid], timeout=30).returncode != 0
