"""A local RollArt cluster as processes: a private redis-server, then the services, with a state file.

The state file (``<state dir>/state.json``) records every process's pid, address and log, so ``rollart status``
and ``rollart down`` work from any shell. The job token is generated once per state dir (mode 0600).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .mooncake import mooncake_master_binary, start_mooncake_master
from .processes import ManagedProcess, ProcessError, pid_alive, start_redis, stop_pid
from .regions import RegionPlan, Regions


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    script: str
    # Redis database number for services that keep state in Redis, else None.
    redis_db: int | None = None
    # Extra environment for the service, given the running cluster's state.
    extra_env: Callable[[dict], dict[str, str]] | None = None
    # Seconds to wait for its ready file, when more than up()'s default (an engine start, a model build).
    ready_timeout: float | None = None
    # Instances started by default (`up(replicas=...)` overrides); the first is named `name`, the others
    # `name-2`, `name-3`, ...
    replicas: int = 1
    # Run before each instance starts, with the cluster's state and the instance's environment (e.g. build
    # the model an actor is told to serve when it is not there yet).
    prepare: Callable[[dict, dict[str, str], Callable[[str], None]], None] | None = None
    # Its instances start side by side (each then waited for) on a host without a GPU; on a GPU host one at a
    # time, so that engines sharing a device never size their memory against each other's half-made start.
    start_together: bool = False


# Start order: discovery first, then the ledger (everyone settles with it), then the rest.
SERVICES: list[ServiceSpec] = [
    ServiceSpec("resource-manager", "rollart-resource-manager", redis_db=0),
    ServiceSpec("ledger", "rollart-ledger", redis_db=1),
    # The relay's data endpoint (striped transport) is chosen at start and recorded from its ready file.
    ServiceSpec("relay", "rollart-relay", extra_env=lambda st: {"ROLLART_CACHE_DIR": f"{st['state_dir']}/relay-cache"}),
    # Before the actors: they fall back to the trainer's Relay API when their relay dies. Jobs arrive with
    # StartJob (`rollart run`); a restarted trainer resumes the job kept in its work dir.
    ServiceSpec("trainer", "rollart-trainer", extra_env=lambda st: _trainer_env(st), ready_timeout=180.0),
    ServiceSpec("reward", "rollart-reward", redis_db=2),  # idempotency cache: first answers survive restarts
    # Serves ROLLART_MODEL when set, else the tiny test model, built into the state dir before the first start.
    ServiceSpec(
        "actor",
        "rollart-actor",
        extra_env=lambda st: _actor_env(st),
        ready_timeout=600.0,
        prepare=lambda st, env, log: _default_model(st, env, log),
        start_together=True,
    ),
    # The OpenAI-compatible HTTP API on a free port (its base URL lands in the state from the ready file); it
    # follows the ledger's step plans when a ledger runs.
    ServiceSpec("llmproxy", "rollart-llmproxy", extra_env=lambda st: _llmproxy_env(st)),
    ServiceSpec("envmanager", "rollart-envmanager", extra_env=lambda st: _peers(st, "ledger", "reward", "llmproxy")),
]
SERVICE_NAMES = [s.name for s in SERVICES]


def _peers(state: dict, *names: str) -> dict[str, str]:
    """ROLLART_<NAME>=address of the peers already running (the ledger does not register with the resource
    manager, so its address travels this way; the others would also be found through it)."""
    running = state.get("services", {})
    return {f"ROLLART_{n.upper()}": running[n]["address"] for n in names if n in running}


def _llmproxy_env(state: dict) -> dict[str, str]:
    env = {"ROLLART_HTTP_LISTEN": "127.0.0.1:0"}
    ledger = state.get("services", {}).get("ledger")
    if ledger:
        env["ROLLART_LEDGER"] = ledger["address"]
    return env


def _actor_env(state: dict) -> dict[str, str]:
    env = {"ROLLART_VLLM_CACHE_DIR": f"{state['state_dir']}/vllm-cache"}
    if not os.environ.get("ROLLART_MODEL"):
        env["ROLLART_MODEL"] = str(_tiny_model_dir(state))
    ledger = state.get("services", {}).get("ledger")
    if ledger:
        env["ROLLART_LEDGER"] = ledger["address"]
    running = state.get("services", {})
    if "relay" in running:  # follow the relay for deltas; the trainer is the fallback source
        env["ROLLART_WEIGHT_SOURCE__RELAY_ENDPOINT"] = running["relay"]["address"]
        if "trainer" in running:
            env["ROLLART_WEIGHT_SOURCE__FALLBACK_ENDPOINTS"] = json.dumps([running["trainer"]["address"]])
    return env


def _tiny_model_dir(state: dict) -> Path:
    return Path(state["state_dir"]) / "models" / "tiny"


def _default_model(state: dict, env: dict[str, str], log: Callable[[str], None]) -> None:
    """Build the tiny test model when the actor is to serve it and it is not there yet (services only ever
    receive a model path; the developer tooling builds models)."""
    out = _tiny_model_dir(state)
    if Path(env.get("ROLLART_MODEL", "")) != out or (out / "config.json").is_file():
        return
    build_tiny_model(out, log)


def build_tiny_model(out: Path, log: Callable[[str], None] = print) -> None:
    """``rollart-devtools tiny-model`` (seeded random weights) into ``out``, whole or not at all."""
    script = find_script("rollart-devtools")
    if script is None:
        raise ProcessError(
            "the actor has no model: set ROLLART_MODEL to a checkpoint directory, or install rollart-devtools "
            "(`make setup`) to build the tiny test model"
        )
    log(f"{'model':<16} building the tiny test model in {out}")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    argv = [script, "tiny-model", "--out", str(tmp), "--pretrain-steps", "0", "--seed", "0"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ProcessError(f"building the tiny model failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _trainer_env(state: dict) -> dict[str, str]:
    env = {"ROLLART_WORK_DIR": f"{state['state_dir']}/trainer"}
    env.update(_peers(state, "ledger"))
    relay = state.get("services", {}).get("relay")
    if relay:
        env["ROLLART_RELAYS"] = json.dumps([relay["address"]])
    if state.get("mooncake"):
        env["ROLLART_MOONCAKE_MASTER"] = state["mooncake"]["address"]
    return env


def instance_names(spec: ServiceSpec, replicas: int) -> list[str]:
    return [spec.name if i == 0 else f"{spec.name}-{i + 1}" for i in range(replicas)]


def pool_instances(
    service: str, pools: Sequence[tuple[int, Callable[[int], dict[str, str]]]]
) -> dict[str, dict[str, str]]:
    """Instances of ``service`` for pools given as (count, environment of the pool's i-th member), in order:
    instance name -> its environment, for ``up(replicas={service: total}, env_overrides=...)``. Two pools of
    two actors are ``actor`` and ``actor-2`` in the first, ``actor-3`` and ``actor-4`` in the second."""
    spec = next(s for s in SERVICES if s.name == service)
    names = iter(instance_names(spec, sum(count for count, _ in pools)))
    return {next(names): env_of(i) for count, env_of in pools for i in range(count)}


def default_state_dir() -> Path:
    return Path(os.environ.get("ROLLART_STATE_DIR", ".rollart")).resolve()


def find_script(script: str) -> str | None:
    """The console script next to this interpreter first (the project's .venv), then PATH."""
    local = Path(sys.executable).parent / script
    if local.exists():
        return str(local)
    return shutil.which(script)


def job_token(state_dir: Path) -> tuple[str, Path]:
    path = state_dir / "job-token"
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
    return path.read_text().strip(), path


def job_key(state_dir: Path) -> Path:
    """The job's segment key (HMAC of delta segments, transport handshakes): a file next to the token, 0600.

    Separate from the bearer token on purpose: the token travels in every RPC's metadata, the key never
    leaves the process that holds it.
    """
    path = state_dir / "job-key"
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
    return path


def read_state(state_dir: Path) -> dict:
    path = state_dir / "state.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def write_state(state_dir: Path, state: dict) -> None:
    path = state_dir / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def up(
    state_dir: Path,
    only: list[str] | None = None,
    *,
    log: Callable[[str], None] = print,
    ready_timeout: float = 60.0,
    with_mooncake: bool | None = None,
    replicas: dict[str, int] | None = None,
    env_overrides: dict[str, dict[str, str]] | None = None,
    regions: Regions | None = None,
) -> dict:
    """Start redis and the requested services (default: every installed one). Returns the state.

    ``replicas``: instances per service (e.g. ``{"actor": 2}``); ``env_overrides``: extra environment per
    service name (every instance of it), then per instance name (``actor-2``), applied last. ``regions``: each
    instance binds its region's address and reaches other regions only through emulated links (regions.py).
    """
    state = read_state(state_dir)
    procs = [state.get("redis", {}), state.get("mooncake", {}), *state.get("services", {}).values()]
    if state and any(pid_alive(p["pid"]) for p in procs if p):
        raise ProcessError(f"a cluster is already running from {state_dir} (run `rollart down` first)")
    unknown = [n for n in only or [] if n not in SERVICE_NAMES]
    if unknown:
        raise ProcessError(f"unknown service(s) {unknown}; known: {SERVICE_NAMES}")
    token, token_file = job_token(state_dir)
    del token  # only the file path travels to children
    specs = [s for s in SERVICES if only is None or s.name in only]
    state = {"state_dir": str(state_dir), "token_file": str(token_file), "services": {}, "started_at": time.time()}
    redis_proc, redis_url = start_redis(state_dir / "redis")
    state["redis"] = {"pid": redis_proc.pid, "url": redis_url, "log": str(redis_proc.log_path)}
    write_state(state_dir, state)
    log(f"redis            {redis_url}")
    pending: list[tuple[ServiceSpec, str, ManagedProcess, str, dict[str, str]]] = []  # started, not yet ready
    try:
        # The weight plane's Mooncake store (full-weight buckets), when the wheel is installed.
        # Only the trainer (publisher) and actors (pullers) use it.
        if with_mooncake is None:
            with_mooncake = only is None or bool({"trainer", "actor"} & set(only))
        if regions is not None:  # its transfer engine's ports would cross regions outside the links
            with_mooncake = False
        if with_mooncake and mooncake_master_binary() is not None:
            master = start_mooncake_master(state_dir / "mooncake")
            state["mooncake"] = master.info()
            write_state(state_dir, state)
            log(f"mooncake         {master.address}  (metrics :{master.metrics_port}, pid {master.pid})")
        instances = [
            (spec, name)
            for spec in specs
            for name in instance_names(spec, (replicas or {}).get(spec.name, spec.replicas))
        ]
        plan = None
        if regions is not None:
            plan = RegionPlan(regions, [name for spec, name in instances if find_script(spec.script)], state_dir)
            state["regions"] = plan.to_state()
            links = plan.start_links(log)
            state["links"] = {"pid": links.pid, "log": str(links.log_path), "counters": str(state_dir / "links.json")}
            write_state(state_dir, state)
        # The instances of a start_together service start side by side, then each is waited for (two CPU engines
        # load at once, not one after the other); a service waits for those before it.
        together = shutil.which("nvidia-smi") is None
        for i, (spec, name) in enumerate(instances):
            script = find_script(spec.script)
            if script is None:
                if only is not None:
                    raise ProcessError(f"{spec.name}: {spec.script} is not installed (run `make setup`)")
                log(f"{spec.name:<16} skipped ({spec.script} not installed)")
                continue
            run_dir = state_dir / "run"
            env = dict(os.environ)
            env.update(
                {
                    "ROLLART_LISTEN": "127.0.0.1:0",
                    "ROLLART_METRICS_LISTEN": "127.0.0.1:0",
                    "ROLLART_JOB_TOKEN_FILE": str(token_file),
                    "ROLLART_JOB_KEY_FILE": str(job_key(state_dir)),
                    "ROLLART_READY_FILE": str(run_dir / f"{name}.ready"),
                    "ROLLART_TRACING__EXPORTER": "file",
                    "ROLLART_TRACING__FILE": str(state_dir / "traces" / f"{name}.jsonl"),
                }
            )
            env.pop("ROLLART_JOB_TOKEN", None)
            env.pop("ROLLART_JOB_KEY", None)
            rm_info = state["services"].get("resource-manager")
            if rm_info:
                env["ROLLART_RESOURCE_MANAGER"] = rm_info["address"]
            if state.get("mooncake"):
                env["ROLLART_MOONCAKE_MASTER"] = state["mooncake"]["address"]
            if spec.redis_db is not None:
                env["ROLLART_REDIS_URL"] = redis_url.rsplit("/", 1)[0] + f"/{spec.redis_db}"
            if spec.extra_env is not None:
                env.update(spec.extra_env(state))
            if spec.name == "envmanager":
                # A stable id (its lease holder prefix): a restarted envmanager releases what its predecessor held.
                env["ROLLART_MANAGER_ID"] = name
            env.update((env_overrides or {}).get(spec.name, {}))
            if name != spec.name:  # then an instance's own (e.g. "actor-2": another pool)
                env.update((env_overrides or {}).get(name, {}))
            if plan is not None:  # its region's listeners; peers elsewhere through its region's forwarders
                env.update(plan.listen_env(name))
                env = plan.rewrite(name, env)
                leaks = plan.audit(name, env)
                if leaks:
                    raise ProcessError(f"{name}: addresses outside its region not through a link: {leaks}")
            if spec.prepare is not None:
                spec.prepare(state, env, log)
            # What this instance got on top of our environment: restart() starts it again the same way.
            overlay = {k: v for k, v in env.items() if k.startswith("ROLLART_") or os.environ.get(k) != v}
            proc = ManagedProcess(
                name,
                pinned([script], env),
                log_path=state_dir / "logs" / f"{name}.log",
                env=env,
                ready_file=run_dir / f"{name}.ready",
            )
            pending.append((spec, name, proc, script, overlay))
            proc.start()
            if together and spec.start_together and i + 1 < len(instances) and instances[i + 1][0] is spec:
                continue  # the next instance of this service starts before this one is waited for
            while pending:
                spec, name, proc, script, overlay = pending[0]
                info = proc.wait_ready(max(ready_timeout, spec.ready_timeout or 0.0))
                pending.pop(0)
                _record(state, state_dir, name, proc, info, script, overlay, log)
    except BaseException:
        for _spec, _name, proc, _script, _overlay in pending:  # started, not in the state yet: down() cannot see them
            proc.stop(timeout=5.0)
        down(state_dir, log=lambda _m: None)
        raise
    return state


def _record(
    state: dict,
    state_dir: Path,
    name: str,
    proc: ManagedProcess,
    info: dict,
    script: str,
    overlay: dict[str, str],
    log: Callable[[str], None],
) -> None:
    """A ready instance into the state (and state.json), with the extra endpoints its ready file announced."""
    state["services"][name] = {
        "pid": proc.pid,
        "address": info["address"],
        "metrics_port": info.get("metrics_port"),
        "log": str(proc.log_path),
        "script": script,
        "env": overlay,
    }
    # Extra endpoints a service announces in its ready file (e.g. the relay's data_endpoint).
    extra = {k: v for k, v in info.items() if k not in ("service", "address", "metrics_port", "pid")}
    state["services"][name].update(extra)
    write_state(state_dir, state)
    log(f"{name:<16} {info['address']}  (metrics :{info.get('metrics_port')}, pid {proc.pid})")


def pinned(argv: list[str], env: dict[str, str]) -> list[str]:
    """``ROLLART_CPUS`` (a taskset CPU list, e.g. "0" or "1-3") confines a service and every process it starts
    (vLLM's engine, sandboxes) to those CPUs: on one host this emulates separate machines for the trainer and
    the rollout side. taskset execs the service, so the pid stays the service's."""
    cpus = env.get("ROLLART_CPUS", "").strip()
    if not cpus:
        return argv
    if shutil.which("taskset") is None:
        raise ProcessError("ROLLART_CPUS is set but taskset (util-linux) is not installed")
    return ["taskset", "-c", cpus, *argv]


def restart(state_dir: Path, name: str, *, ready_timeout: float = 180.0) -> dict:
    """Start a dead service of the cluster again, on the same addresses (its peers keep theirs). Returns its
    new state entry. A supervisor (``rollart run``) calls it after a crash or a SIGKILL."""
    state = read_state(state_dir)
    info = state.get("services", {}).get(name)
    if info is None or "script" not in info:
        raise ProcessError(f"no restartable service {name!r} in {state_dir}")
    if pid_alive(info["pid"]):
        raise ProcessError(f"{name} is running (pid {info['pid']})")
    env = dict(os.environ)
    env.pop("ROLLART_JOB_TOKEN", None)
    env.pop("ROLLART_JOB_KEY", None)
    env.update(info["env"])
    env["ROLLART_LISTEN"] = info["address"]
    if info.get("metrics_port"):
        env["ROLLART_METRICS_LISTEN"] = f"127.0.0.1:{info['metrics_port']}"
    if info.get("data_endpoint"):  # the relay's striped-transport listener
        env["ROLLART_DATA_LISTEN"] = info["data_endpoint"]
    ready = Path(env["ROLLART_READY_FILE"])
    argv = pinned([info["script"]], env)
    proc = ManagedProcess(name, argv, log_path=Path(info["log"]), env=env, ready_file=ready).start()
    new = proc.wait_ready(ready_timeout)
    info = dict(info, pid=proc.pid, restarts=int(info.get("restarts", 0)) + 1)
    info.update({k: v for k, v in new.items() if k not in ("service", "pid")})
    state = read_state(state_dir)
    state["services"][name] = info
    write_state(state_dir, state)
    return info


def down(state_dir: Path, *, log: Callable[[str], None] = print) -> bool:
    """Stop every process of the cluster (services in reverse start order, then redis). True if all are gone."""
    state = read_state(state_dir)
    if not state:
        log(f"no cluster state in {state_dir}")
        return True
    ok = True
    for name in reversed(list(state.get("services", {}))):
        gone = stop_pid(state["services"][name]["pid"])
        ok &= gone
        log(f"{name:<16} {'stopped' if gone else 'STILL RUNNING'}")
    if state.get("mooncake"):
        gone = stop_pid(state["mooncake"]["pid"])
        ok &= gone
        log(f"{'mooncake':<16} {'stopped' if gone else 'STILL RUNNING'}")
    if state.get("links"):
        gone = stop_pid(state["links"]["pid"])
        ok &= gone
        log(f"{'links':<16} {'stopped' if gone else 'STILL RUNNING'}")
    if state.get("redis"):
        gone = stop_pid(state["redis"]["pid"])
        ok &= gone
        log(f"{'redis':<16} {'stopped' if gone else 'STILL RUNNING'}")
    if ok:
        (state_dir / "state.json").unlink(missing_ok=True)
    return ok
