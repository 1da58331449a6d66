"""The supervisor restarts the emulated links process of a job with regions as it does redis and the services."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from rollart.local import cluster as local
from rollart.local.processes import stop_pid
from rollart.local.supervisor import Supervisor, supervised


def test_a_dead_links_process_is_restarted_on_its_addresses(tmp_path: Path, links_plan_file: str):
    dead = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    while Path(f"/proc/{dead.pid}/stat").read_text().split(")")[1].split()[0] != "Z":  # dead, not reaped
        time.sleep(0.01)
    local.write_state(tmp_path, {"links": {"pid": dead.pid, "log": str(tmp_path / "links.log")}})
    assert list(supervised(local.read_state(tmp_path))) == ["links"]
    sup = Supervisor(tmp_path)
    events = sup.check()
    new = local.read_state(tmp_path)["links"]
    try:
        assert [(e.process, e.kind, e.cause) for e in events] == [("links", "restarted", "killed by SIGKILL")]
        assert events[0].new_pid == new["pid"] != dead.pid and new["restarts"] == 1
        host, port = links_plan_file.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()
        assert sup.check() == []  # alive: left alone
    finally:
        assert stop_pid(new["pid"])
