"""Sandbox helpers: limits, budgets, safe paths, tar streams, failure classification, backend names."""

import io
import signal
import tarfile

import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.v1 import envmanager_pb2
from rollart_envmanager.sandbox import FailureCause, SandboxFailure, SandboxLimits, backend_name
from rollart_envmanager.sandbox.base import TimeBudget, classify_signal, classify_stderr, safe_relpath, tar_bytes


def test_limits_validation_and_proto():
    with pytest.raises(ValueError):
        SandboxLimits(time_budget_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(memory_mib=-1)
    spec = envmanager_pb2.SandboxSpec(memory_mib=300, time_budget=Duration(seconds=5), writable_root=True)
    lim = SandboxLimits.from_proto(spec)
    assert (lim.memory_mib, lim.time_budget_s, lim.writable_root, lim.pids_limit) == (300, 5.0, True, 64)


def test_time_budget():
    now = [100.0]
    b = TimeBudget(10, clock=lambda: now[0])
    b.start()
    assert b.timeout(3) == (3, FailureCause.TIMEOUT)
    now[0] = 108.5
    t, cause = b.timeout(3)
    assert t == pytest.approx(1.5) and cause is FailureCause.BUDGET
    now[0] = 111
    with pytest.raises(SandboxFailure) as err:
        b.check()
    assert err.value.cause is FailureCause.BUDGET


@pytest.mark.parametrize("bad", ["", "../x", "a/../../x", "/etc/passwd", ".", "a\x00b"])
def test_safe_relpath_rejects(bad):
    with pytest.raises(ValueError):
        safe_relpath(bad)


def test_safe_relpath_accepts():
    assert safe_relpath("a/b/../c.py") == "a/c.py"
    assert safe_relpath("/workspace/repo/x.py") == "repo/x.py"


def test_tar_bytes_round_trip():
    data = tar_bytes({"repo/a.py": "print(1)\n", "b.bin": b"\x00\x01"})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        assert {"repo", "repo/a.py", "b.bin"} <= set(names)
        assert tar.extractfile("repo/a.py").read() == b"print(1)\n"
    with pytest.raises(ValueError):
        tar_bytes({"../evil": "x"})


def test_classification():
    assert classify_signal(signal.SIGXCPU) is FailureCause.CPU
    assert classify_signal(signal.SIGXFSZ) is FailureCause.FILE_SIZE
    assert classify_signal(signal.SIGKILL) is FailureCause.CRASH
    assert classify_signal(signal.SIGTERM) is None
    assert classify_stderr(b"Traceback...\nMemoryError\n") is FailureCause.MEMORY
    assert classify_stderr(b"BlockingIOError: [Errno 11] Resource temporarily unavailable") is FailureCause.PIDS
    assert classify_stderr(b"OSError: [Errno 27] File too large") is FailureCause.FILE_SIZE
    assert classify_stderr(b"No space left on device") is FailureCause.WORKSPACE
    assert classify_stderr(b"AssertionError") is None


def test_failure_pickles_with_its_cause():
    import pickle

    f = pickle.loads(pickle.dumps(SandboxFailure(FailureCause.MEMORY, "boom", backend="bwrap", details={"a": 1})))
    assert f.cause is FailureCause.MEMORY and f.backend == "bwrap" and f.details == {"a": 1}
    assert str(f) == "[sandbox-oom] boom"


def test_backend_names():
    assert backend_name("SANDBOX_BACKEND_BWRAP") == "bwrap"
    assert backend_name(4) == "docker"
    assert backend_name("in-process") == "in_process"
    with pytest.raises(ValueError):
        backend_name("vm")
