"""Supervision of a local cluster: every process ``rollart up`` started (redis-server, the Mooncake master and
the services) is started again when it dies, on the same address, and each restart is an event with its cause.

Invariants:

* Redis comes back on the same port with the same folder and AOF (``appendfsync always``): every write the
  services had acknowledged is there again; they reconnect by themselves.
* The Mooncake master comes back on the same ports with an empty store (it keeps no state); the trainer
  publishes the next version's buckets again and actors fall back to the relay meanwhile.
* Order: redis, then mooncake, then services in start order (a service restarted before its store would fail
  its first requests).
* A process is restarted at most ``max_restarts`` times; after that (or when ``wanted`` says no) it is
  reported dead once and left alone.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import cluster as local
from .mooncake import MooncakeMaster
from .processes import ProcessError, pid_alive, start_redis
from .regions import restart_links

#: Processes that are not services of the cluster's state but are supervised all the same (``links``: the
#: emulated inter-region links and the checkpoint file server of a job with ``cluster.regions``).
STORES = ("redis", "mooncake", "links")


@dataclass
class Event:
    """One thing the supervisor saw or did (``rollart run`` writes them to events.jsonl and summary.json)."""

    at: float  # time.time()
    process: str
    kind: str  # "restarted", "restart-failed", "dead" (left alone), "loops-restored"
    cause: str  # why: how the process ended ("killed by SIGKILL", "exited with code 1", ...)
    pid: int | None = None  # the process that ended
    new_pid: int | None = None
    seconds: float = 0.0  # how long the restart took (until ready)
    detail: str = ""

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


def exit_cause(pid: int) -> str:
    """How ``pid`` ended, when it is our child and not reaped yet (reaping it here); else what is known."""
    deadline = time.monotonic() + 1.0  # /proc may show the zombie just before the parent can reap it
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "process gone (exit status not known here)"
        if got:
            break
        if time.monotonic() > deadline:
            return "process gone (exit status not reported yet)"
        time.sleep(0.02)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by {name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def supervised(state: dict) -> dict[str, dict]:
    """Every supervised process of the state, in restart order: {name: its state entry}."""
    out: dict[str, dict] = {}
    for name in STORES:
        if state.get(name):
            out[name] = state[name]
    out.update(state.get("services", {}))
    return out


def restart_redis(state_dir: Path) -> dict:
    """redis-server again on its port and folder (its AOF replays every acknowledged write)."""
    state = local.read_state(state_dir)
    info = state.get("redis")
    if not info:
        raise ProcessError(f"no redis in {state_dir}")
    if pid_alive(info["pid"]):
        raise ProcessError(f"redis is running (pid {info['pid']})")
    port = int(info["url"].rsplit(":", 1)[1].split("/", 1)[0])
    proc, _url = start_redis(state_dir / "redis", port=port)
    info = dict(info, pid=proc.pid, restarts=int(info.get("restarts", 0)) + 1)
    state = local.read_state(state_dir)
    state["redis"] = info
    local.write_state(state_dir, state)
    return info


def restart_mooncake(state_dir: Path) -> dict:
    """The Mooncake master again on its ports (empty: the master keeps no state)."""
    state = local.read_state(state_dir)
    info = state.get("mooncake")
    if not info:
        raise ProcessError(f"no mooncake master in {state_dir}")
    if pid_alive(info["pid"]):
        raise ProcessError(f"mooncake is running (pid {info['pid']})")
    host, port = info["address"].rsplit(":", 1)
    master = MooncakeMaster(state_dir / "mooncake", host, int(port), int(info["metrics_port"])).start()
    info = dict(info, pid=master.pid, restarts=int(info.get("restarts", 0)) + 1)
    state = local.read_state(state_dir)
    state["mooncake"] = info
    local.write_state(state_dir, state)
    return info


def restart_process(state_dir: Path, name: str, ready_timeout: float = 180.0) -> dict:
    if name == "redis":
        return restart_redis(state_dir)
    if name == "mooncake":
        return restart_mooncake(state_dir)
    if name == "links":
        return restart_links(state_dir, ready_timeout=min(ready_timeout, 60.0))
    return local.restart(state_dir, name, ready_timeout=ready_timeout)


@dataclass
class Supervisor:
    """Restarts the dead processes of the cluster in ``state_dir``; :meth:`check` is one pass (call it every
    second or so). ``wanted(name)`` says whether a process may be restarted (instances ``actor-2`` are also
    asked as ``actor``)."""

    state_dir: Path
    wanted: Callable[[str], bool] = lambda _name: True
    max_restarts: int = 5
    ready_timeout: float = 180.0
    restarts: dict[str, int] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)

    def check(self, on_event: Callable[[Event], object] = lambda _e: None) -> list[Event]:
        state = local.read_state(self.state_dir)
        new: list[Event] = []
        for name, info in supervised(state).items():
            if name in self.dead or pid_alive(info["pid"]):
                continue
            cause = exit_cause(info["pid"])
            n = self.restarts.get(name, 0)
            if not self.wanted(name) or n >= self.max_restarts:
                self.dead.add(name)
                why = "not restarted (run.restart)" if n < self.max_restarts else f"{n} restarts already"
                ev = Event(time.time(), name, "dead", cause, pid=info["pid"], detail=why)
            else:
                self.restarts[name] = n + 1
                t0 = time.monotonic()
                try:
                    new_info = restart_process(self.state_dir, name, self.ready_timeout)
                    ev = Event(
                        time.time(),
                        name,
                        "restarted",
                        cause,
                        pid=info["pid"],
                        new_pid=new_info["pid"],
                        seconds=round(time.monotonic() - t0, 3),
                    )
                except ProcessError as exc:
                    ev = Event(
                        time.time(),
                        name,
                        "restart-failed",
                        cause,
                        pid=info["pid"],
                        seconds=round(time.monotonic() - t0, 3),
                        detail=str(exc)[:2000],
                    )
            self.events.append(ev)
            new.append(ev)
            on_event(ev)
        return new


def base_name(name: str) -> str:
    """``actor-2`` -> ``actor`` (an instance's service name)."""
    head, _, tail = name.rpartition("-")
    return head if head and tail.isdigit() else name


def supervise(
    state_dir: Path,
    *,
    log: Callable[[str], None] = print,
    interval: float = 1.0,
    stop: Callable[[], bool] = lambda: False,
) -> Supervisor:
    """``rollart up --supervise``: restart what dies until ``stop()`` (or Ctrl-C); every event is logged and
    appended to ``<state dir>/events.jsonl``."""
    sup = Supervisor(state_dir)
    path = state_dir / "events.jsonl"

    def record(ev: Event) -> None:
        with path.open("a") as fh:
            fh.write(json.dumps(ev.to_dict(), sort_keys=True) + "\n")
        log(f"{ev.process:<16} {ev.kind} ({ev.cause}){' ' + ev.detail[:300] if ev.detail else ''}")

    while not stop() and local.read_state(state_dir):
        sup.check(record)
        time.sleep(interval)
    return sup
