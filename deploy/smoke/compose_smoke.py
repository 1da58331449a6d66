"""`make compose-smoke`: the compose cluster runs a job, end to end, from images to teardown.

1. builds the images (deploy/docker/build-images.sh; cached layers make a rebuild take seconds), the tiny
   model on the host (rollart-devtools, cached in build/compose-smoke/models) and development certificates;
2. checks bad input, one container at a time: no segment key, no token, a certificate from the wrong CA:
   each container exits with a log line naming the setting, and no traceback;
3. starts docker compose (docker-compose.yml + docker-compose.local.yml [+ docker-compose.tls.yml]): redis,
   the Mooncake master, every service, two CPU actors, all on the host's loopback;
4. waits until every container is healthy (their HEALTHCHECKs, over mTLS by default), starts a short
   FrozenLake job through the trainer's API from the host (StartJob, then the envmanager's StartLoops, as
   `rollart run` does), waits for N steps with both actors on the newest version, checks health again;
5. stops everything and removes what it created (containers, volumes, the work folder), also on failure.

Prints one JSON line of timings at the end; exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.local.yml"]
# Host ports of docker-compose.local.yml.
PORTS = {
    "resource-manager": 25051,
    "ledger": 25052,
    "relay": 25053,
    "trainer": 25054,
    "actor": 25055,
    "llmproxy": 25056,
    "envmanager": 25057,
    "reward": 25058,
    "actor-2": 25059,
}
MOONCAKE = "127.0.0.1:25088"
JOB_ID = "compose-smoke"
# The images the cluster runs (the Mooncake master runs from the trainer's; no devtools image: the model is
# built on the host).
SERVICE_IMAGES = ["resource-manager", "ledger", "relay", "trainer", "actor", "llmproxy", "envmanager", "reward"]
UID = 10001  # the images' user
MODEL_IN_CONTAINERS = "/var/lib/rollart/models/tiny"
WEIGHTS_IN_CONTAINERS = "/var/lib/rollart/weights"


def say(text: str) -> None:
    print(f"[compose-smoke] {text}", file=sys.stderr, flush=True)


class SmokeFailure(Exception):
    pass


def run(
    argv: list[str], *, timeout: float = 600, env: dict[str, str] | None = None, check: bool = True, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise SmokeFailure(f"{' '.join(argv[:6])} failed ({proc.returncode}):\n{(proc.stderr or proc.stdout)[-4000:]}")
    return proc


def ensure_docker() -> Any:
    """A daemon that answers; started here (root, no bridge) when none runs. Returns what to stop."""
    from rollart_envmanager.sandbox import docker as dk

    ok, reason = dk.availability(refresh=True)
    if ok:
        return None
    say(f"docker: {reason}; starting dockerd (--bridge=none)")
    return dk.start_daemon(os.path.join(tempfile.gettempdir(), "rollart-dockerd", "log"))


def stop_docker(daemon: Any) -> None:
    if daemon is not None:
        from rollart_envmanager.sandbox import docker as dk

        dk.stop_daemon(daemon)


def build_model(cache: Path) -> Path:
    """The tiny model, built once on the host (untrained: the smoke run checks plumbing, not learning)."""
    out = cache / "models" / "tiny"
    if not (out / "config.json").is_file():
        devtools = shutil.which("rollart-devtools") or str(Path(sys.executable).parent / "rollart-devtools")
        tmp = out.with_name("tiny.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        run([devtools, "tiny-model", "--out", str(tmp), "--pretrain-steps", "0", "--seed", "0"], timeout=600)
        tmp.rename(out)
    return out


def chown_tree(path: Path) -> None:
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.chown(name, UID, UID)


class Cluster:
    def __init__(self, project: str, env: dict[str, str], tls: str) -> None:
        self.project = project
        self.env = env
        self.files = COMPOSE_FILES + (["docker-compose.tls.yml"] if tls != "none" else [])
        self.compose = shutil.which("docker-compose")
        if self.compose is None:
            raise SmokeFailure("docker-compose is not installed (Debian package docker-compose)")

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        argv = [self.compose, "-p", self.project]
        for f in self.files:
            argv += ["-f", str(REPO / f)]
        return run([*argv, *args], timeout=timeout, env=self.env, check=check)

    def containers(self) -> dict[str, dict[str, Any]]:
        """service -> docker inspect of its container."""
        ids = self("ps", "-q", "-a").stdout.split()
        if not ids:
            return {}
        out = json.loads(run(["docker", "inspect", *ids]).stdout)
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in out}

    def wait_healthy(self, timeout: float) -> float:
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            state = self.containers()
            status = {}
            for name, c in state.items():
                if name == "model":
                    status[name] = (
                        "done"
                        if c["State"]["Status"] == "exited" and c["State"]["ExitCode"] == 0
                        else c["State"]["Status"]
                    )
                elif c["State"]["Status"] != "running":
                    status[name] = c["State"]["Status"]
                else:
                    status[name] = c["State"].get("Health", {}).get("Status", "no healthcheck")
            if status and all(s in ("healthy", "done") for s in status.values()):
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                bad = {n: s for n, s in status.items() if s not in ("healthy", "done")}
                logs = "\n".join(f"--- {n}\n{self('logs', '--tail', '15', n, check=False).stdout}" for n in bad)
                raise SmokeFailure(f"not healthy after {timeout:.0f}s: {bad}\n{logs}")
            time.sleep(3)

    def logs(self, tail: int = 12) -> str:
        """The last lines of every container that is not healthy, for a failure report."""
        out = []
        for name, c in self.containers().items():
            health = c["State"].get("Health", {}).get("Status", c["State"]["Status"])
            if health != "healthy" and name != "model":
                text = self("logs", "--no-color", "--tail", str(tail), name, check=False).stdout
                out.append(f"--- {name} ({health})\n{text}")
        return "\n".join(out)

    def kill_service_process(self, service: str) -> int:
        """SIGKILL the service's own process (the child of the container's init), as a crash would: the
        container exits non-zero and its restart policy brings it back (``docker kill`` would count as a
        manual stop). Returns the restart count before the kill."""
        c = self.containers()[service]
        init_pid = c["State"]["Pid"]
        children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
        if not children:
            raise SmokeFailure(f"{service}: no process under the container's init (pid {init_pid})")
        for pid in children:
            os.kill(int(pid), signal.SIGKILL)
        return int(c["RestartCount"])

    def wait_restarted(self, service: str, restarts_before: int, timeout: float) -> float:
        """Until ``service`` has been restarted by its policy and is healthy again; the seconds it took."""
        t0 = time.monotonic()
        while True:
            c = self.containers()[service]
            health = c["State"].get("Health", {}).get("Status")
            if int(c["RestartCount"]) > restarts_before and health == "healthy":
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                logs = self("logs", "--no-color", "--tail", "20", service, check=False).stdout
                raise SmokeFailure(
                    f"{service} not back after {timeout:.0f}s (restarts {c['RestartCount']}, {health}):\n{logs}"
                )
            time.sleep(2)

    def down(self) -> None:
        self("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300, check=False)


def bad_input_checks(tag: str, other_pki: Path, names: list[str]) -> dict[str, str]:
    """Each case: a container that must exit with one log line naming the setting, no traceback.

    "wrong certificate" needs the cluster running with TLS (it dials the resource manager)."""
    base = ["docker", "run", "--rm", "--network", "host", "--user", str(UID)]
    token = ["-e", "ROLLART_JOB_TOKEN=" + secrets.token_hex(16), "-e", "ROLLART_METRICS_LISTEN=127.0.0.1:0"]
    cases = {
        # The weight plane refuses to start without the job's segment key.
        "missing job key": (
            [*base, *token, "-e", "ROLLART_LISTEN=127.0.0.1:0", f"rollart/relay:{tag}"],
            ["job_key", "ROLLART_JOB_KEY"],
        ),
        # Every service refuses to start without the job token.
        "missing job token": (
            [*base, "-e", "ROLLART_LISTEN=127.0.0.1:0", f"rollart/ledger:{tag}"],
            ["job_token", "ROLLART_JOB_TOKEN"],
        ),
        # A TLS setting that names no file.
        "missing certificate file": (
            [
                *base,
                *token,
                "-e",
                "ROLLART_LISTEN=127.0.0.1:0",
                "-e",
                "ROLLART_TLS__CERT_FILE=/nonexistent.crt",
                "-e",
                "ROLLART_TLS__KEY_FILE=/nonexistent.key",
                f"rollart/resource-manager:{tag}",
            ],
            ["tls.cert_file", "ROLLART_TLS__CERT_FILE"],
        ),
    }
    if "wrong certificate" in names:
        # A client certificate and CA from another PKI: the reward's registration with the (m)TLS resource
        # manager of the running cluster fails; one line says so.
        cases["wrong certificate"] = (
            [
                *base,
                *token,
                "-e",
                "ROLLART_LISTEN=127.0.0.1:0",
                "-v",
                f"{other_pki}:/etc/rollart/tls:ro",
                "-e",
                f"ROLLART_RESOURCE_MANAGER=127.0.0.1:{PORTS['resource-manager']}",
                "-e",
                "ROLLART_TLS__CA_FILE=/etc/rollart/tls/ca.crt",
                "-e",
                "ROLLART_TLS__CLIENT_CERT_FILE=/etc/rollart/tls/client.crt",
                "-e",
                "ROLLART_TLS__CLIENT_KEY_FILE=/etc/rollart/tls/client.key",
                f"rollart/reward:{tag}",
            ],
            ["startup failed"],
        )
    results = {}
    for name in names:
        argv, needles = cases[name]
        proc = run(argv, timeout=120, check=False)
        text = proc.stdout + proc.stderr
        lines = [ln for ln in text.splitlines() if ln.strip() and "ssl_transport_security" not in ln]
        problems = []
        if proc.returncode == 0:
            problems.append("exited 0")
        if "Traceback" in text:
            problems.append("printed a traceback")
        if not any(all(n in ln for n in needles) for ln in lines):
            problems.append(f"no log line names {needles}")
        # One line says what is wrong: the exit message, or one JSON record at ERROR (INFO lines may precede it).
        errors = [ln for ln in lines if not ln.startswith("{") or '"level": "ERROR"' in ln]
        if len(errors) != 1:
            problems.append(f"{len(errors)} error lines, not one")
        if problems:
            raise SmokeFailure(f"bad input '{name}': {', '.join(problems)}; output:\n{text[-2000:]}")
        line = next(ln for ln in lines if needles[0] in ln)
        results[name] = line.strip()[:200]
        say(f"bad input '{name}': exit {proc.returncode}: {results[name]}")
    return results


async def bad_calls(tls_cfg: Any, token: str, spec: Any) -> dict[str, str]:
    """Unauthorised, malformed and oversized calls from the host to the running cluster: each is refused with
    the status that says why, and the cluster stays healthy (checked by the caller)."""
    import grpc

    from rollart.runtime.client import channel
    from rollart.runtime.config import TLSConfig
    from rollart.v1 import ledger_pb2, ledger_pb2_grpc, trainer_pb2, trainer_pb2_grpc
    from rollart.v1 import resource_manager_pb2 as rm
    from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

    def addr(service: str) -> str:
        return f"127.0.0.1:{PORTS[service]}"

    async def code(ch: Any, call: Any) -> str:
        try:
            await call
            return "OK"
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        finally:
            await ch.close()

    malformed = trainer_pb2.TrainerJobSpec()
    malformed.CopyFrom(spec)
    malformed.batch_size = 0
    cases: dict[str, tuple[Any, Any, set[str]]] = {}
    ch = channel(addr("ledger"), token="not-the-job-token", tls=tls_cfg, default_timeout=30.0)
    cases["wrong token"] = (
        ch,
        ledger_pb2_grpc.LedgerStub(ch).GetStatus(ledger_pb2.LedgerStatusRequest()),
        {"UNAUTHENTICATED"},
    )
    ch = channel(addr("trainer"), token=token, tls=tls_cfg, default_timeout=30.0)
    cases["malformed job spec"] = (
        ch,
        trainer_pb2_grpc.TrainerStub(ch).StartJob(trainer_pb2.StartJobRequest(spec=malformed)),
        {"INVALID_ARGUMENT"},
    )
    ch = channel(addr("resource-manager"), token=token, tls=tls_cfg, default_timeout=30.0)
    huge = rm.Pool(name="p", kind=3, capacity=1, labels={"x": "y" * (2 << 20)})  # over the 1 MiB limit
    cases["oversized request"] = (
        ch,
        rm_grpc.ResourceManagerStub(ch).RegisterPool(rm.RegisterPoolRequest(pool=huge)),
        {"RESOURCE_EXHAUSTED"},
    )
    if tls_cfg is not None and tls_cfg.client_cert_file is not None:
        ch = channel(addr("ledger"), token=token, tls=TLSConfig(ca_file=tls_cfg.ca_file), default_timeout=30.0)
        cases["no client certificate"] = (
            ch,
            ledger_pb2_grpc.LedgerStub(ch).GetStatus(ledger_pb2.LedgerStatusRequest()),
            {"UNAVAILABLE"},
        )
    results = {}
    for name, (ch, call, expected) in cases.items():
        got = await code(ch, call)
        if got not in expected:
            raise SmokeFailure(f"bad call '{name}': {got}, expected {' or '.join(sorted(expected))}")
        results[name] = got
        say(f"bad call '{name}': {got}")
    return results


def smoke_job_spec() -> tuple[Any, Any]:
    """The FrozenLake example, made tiny and pointed at the compose cluster's host ports and volumes."""
    from rollart.job.spec import environment_spec, job_spec, load_job_file

    data = load_job_file(REPO / "examples" / "frozenlake.yaml")
    spec = job_spec(data["job"])
    spec.job_id = JOB_ID
    # Two groups of 4, episodes of at most 2 turns: a step is ~16 short generations, which a 2-core host
    # shared with other work still finishes well inside batch_timeout (16 samples of 8-turn episodes did not
    # in 300 s at a load average of 44).
    spec.batch_size, spec.group_size = 8, 4
    spec.batch_timeout.FromSeconds(900)
    spec.model = MODEL_IN_CONTAINERS
    spec.endpoints.ledger = f"127.0.0.1:{PORTS['ledger']}"
    spec.endpoints.llmproxy = f"127.0.0.1:{PORTS['llmproxy']}"
    del spec.publish.relay_endpoints[:]
    spec.publish.relay_endpoints.append(f"127.0.0.1:{PORTS['relay']}")
    spec.publish.mooncake_master = MOONCAKE
    spec.publish.checkpoint_store = WEIGHTS_IN_CONTAINERS
    env = environment_spec(data["environment"])
    env.max_turns = 2
    return spec, env


async def run_job(
    steps: int,
    loops: int,
    tls_cfg: Any,
    token: str,
    timeout: float,
    crash: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """StartJob + StartLoops from the host, then wait for `steps` versions with both actors on the newest.

    ``crash`` runs once, when version 1 is out (actors pulling it, the next step generating): the job must
    still get to ``steps``."""
    from rollart.runtime.client import channel
    from rollart.v1 import (
        envmanager_pb2,
        envmanager_pb2_grpc,
        ledger_pb2,
        ledger_pb2_grpc,
        trainer_pb2,
        trainer_pb2_grpc,
    )

    spec, env_spec = smoke_job_spec()
    spec.max_steps = steps + 5  # the job is still running when the check passes

    def ch(service: str):
        return channel(f"127.0.0.1:{PORTS[service]}", token=token, tls=tls_cfg, default_timeout=60.0)

    t0 = time.monotonic()
    trainer = ch("trainer")
    job = await trainer_pb2_grpc.TrainerStub(trainer).StartJob(trainer_pb2.StartJobRequest(spec=spec))
    say(f"job {job.spec.job_id}: {trainer_pb2.TrainerJobState.Name(job.state)}")
    env_ch = ch("envmanager")
    await envmanager_pb2_grpc.EnvManagerStub(env_ch).StartLoops(
        envmanager_pb2.StartLoopsRequest(
            group_id="compose-smoke-loops", env=env_spec, count=loops, lease_tasks=[spec.prompts.task]
        )
    )
    ledger = ch("ledger")
    deadline = time.monotonic() + timeout
    seen = ""
    try:
        while True:
            st = await ledger_pb2_grpc.LedgerStub(ledger).GetStatus(ledger_pb2.LedgerStatusRequest(versions_limit=1))
            actors = {a.actor_id: a.weights.active_version for a in st.actors if a.weights.loaded}
            now = f"version {st.latest_version} actors {actors}"
            if now != seen:
                say(now)
                seen = now
            if crash is not None and st.latest_version >= 1:
                crash()
                crash = None
            if st.latest_version >= steps and len(actors) >= 2 and all(v == st.latest_version for v in actors.values()):
                return {"versions": st.latest_version, "actors": actors, "job_s": round(time.monotonic() - t0, 1)}
            j = await trainer_pb2_grpc.TrainerStub(trainer).GetJob(trainer_pb2.GetTrainerJobRequest())
            if j.state == trainer_pb2.TRAINER_JOB_STATE_FAILED:
                raise SmokeFailure(f"the job failed: {j.error}")
            if time.monotonic() > deadline:
                raise SmokeFailure(f"no {steps} steps with both actors on the newest version in {timeout:.0f}s: {now}")
            await asyncio.sleep(2)
    finally:
        for c in (trainer, env_ch, ledger):
            await c.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="versions to reach with both actors on the newest")
    parser.add_argument("--loops", type=int, default=8)
    parser.add_argument("--tls", choices=["none", "tls", "mtls"], default="mtls")
    parser.add_argument("--skip-build", action="store_true", help="use the images already built")
    parser.add_argument("--tag", default=os.environ.get("TAG", "dev"))
    parser.add_argument("--healthy-timeout", type=float, default=1500)
    parser.add_argument("--job-timeout", type=float, default=1200)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (debugging)")
    parser.add_argument(
        "--kill",
        default="relay",
        choices=["", *PORTS, "redis", "mooncake"],
        help="service whose process is SIGKILLed once version 1 is out ('' for none)",
    )
    args = parser.parse_args(argv)

    def terminated(signum: int, frame: Any) -> None:  # a test timeout or Ctrl-C: still tear down (finally)
        raise SmokeFailure(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, terminated)
    timings: dict[str, Any] = {"tls": args.tls}
    t_start = time.monotonic()
    daemon = ensure_docker()
    cluster: Cluster | None = None
    work = Path(tempfile.mkdtemp(prefix="rollart-compose-smoke-"))
    ok = False
    try:
        if not args.skip_build:
            t0 = time.monotonic()
            say("building images (make images)")
            run(
                ["bash", str(REPO / "deploy/docker/build-images.sh"), *SERVICE_IMAGES],
                timeout=3600,
                env={**os.environ, "TAG": args.tag},
            )
            timings["images_s"] = round(time.monotonic() - t0, 1)
        images = dict(
            line.split("=", 1) for line in (REPO / "build/images.env").read_text().splitlines() if "=" in line
        )
        t0 = time.monotonic()
        model = build_model(REPO / "build" / "compose-smoke")
        models = work / "models"
        shutil.copytree(model.parent, models)
        weights, trainer_dir = work / "weights", work / "trainer"
        weights.mkdir()
        trainer_dir.mkdir()
        pki, other_pki = work / "tls", work / "other-tls"
        for d in (pki, other_pki):
            run(["bash", str(REPO / "deploy/tls/make-certs.sh"), str(d)])
        chown_tree(work)
        work.chmod(0o755)
        timings["prepare_s"] = round(time.monotonic() - t0, 1)

        from rollart.job.spec import model_dir_digest
        from rollart.runtime.config import TLSConfig

        token, key = secrets.token_hex(32), secrets.token_hex(32)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")},
            "ROLLART_JOB_TOKEN": token,
            "ROLLART_JOB_KEY": key,
            "ROLLART_JOB_ID": JOB_ID,  # the weight plane's job: StartJob must name the same one
            "ROLLART_TAG": args.tag,
            "REDIS_IMAGE": images.get("REDIS_IMAGE", "redis:7"),
            "ROLLART_MODELS_DIR": str(models),
            "ROLLART_WEIGHTS_DIR": str(weights),
            "ROLLART_TRAINER_DIR": str(trainer_dir),
            "ROLLART_MODEL": MODEL_IN_CONTAINERS,
            "ROLLART_WEIGHT_HASH": model_dir_digest(models / "tiny").hex(),
            "ROLLART_TLS_DIR": str(pki),
            "COMPOSE_HTTP_TIMEOUT": "300",
        }
        if args.tls == "tls":
            env["ROLLART_MTLS_CLIENT_CA"] = ""
        tls_cfg = None
        if args.tls != "none":
            tls_cfg = TLSConfig(
                ca_file=pki / "ca.crt", client_cert_file=pki / "client.crt", client_key_file=pki / "client.key"
            )

        t0 = time.monotonic()
        timings["bad_input"] = bad_input_checks(
            args.tag, other_pki, ["missing job key", "missing job token", "missing certificate file"]
        )
        cluster = Cluster(f"rollart-smoke-{os.getpid()}", env, args.tls)
        say(f"docker-compose up ({' + '.join(cluster.files)}; TLS: {args.tls})")
        t_up = time.monotonic()
        try:
            cluster("up", "-d", "--no-build", timeout=args.healthy_timeout + 300)  # waits for the first actor
        except SmokeFailure as exc:
            raise SmokeFailure(f"{exc}\n{cluster.logs()}") from None
        timings["up_s"] = round(time.monotonic() - t_up, 1)
        timings["healthy_s"] = round(cluster.wait_healthy(args.healthy_timeout), 1)
        say(f"every container healthy after {timings['healthy_s']}s")
        if args.tls != "none":
            timings["bad_input"].update(bad_input_checks(args.tag, other_pki, ["wrong certificate"]))
        timings["bad_calls"] = asyncio.run(bad_calls(tls_cfg, token, smoke_job_spec()[0]))
        killed: dict[str, float] = {}

        def crash() -> None:
            # By default the relay, while actors pull the first update through it (they fall back to the trainer).
            assert cluster is not None
            killed["restarts"] = cluster.kill_service_process(args.kill)
            killed["at"] = time.monotonic()
            say(f"killed {args.kill}'s process (SIGKILL) after version 1")

        timings["job"] = asyncio.run(
            run_job(args.steps, args.loops, tls_cfg, token, args.job_timeout, crash if args.kill else None)
        )
        if args.kill:
            cluster.wait_restarted(args.kill, int(killed["restarts"]), args.healthy_timeout)
            timings["killed"] = {"service": args.kill, "healthy_again_s": round(time.monotonic() - killed["at"], 1)}
            say(f"{args.kill} restarted by its policy and healthy again")
        cluster.wait_healthy(120)  # still all healthy with the job running
        timings["cluster_s"] = round(time.monotonic() - t0, 1)
        ok = True
    except Exception as exc:  # noqa: BLE001 - any failure is reported, then everything is removed
        say(f"FAILED: {type(exc).__name__}: {exc}")
        if cluster is not None and "job" not in timings:  # what the job's services said last
            for name in ("trainer", "ledger", "envmanager", "actor"):
                tail = cluster("logs", "--no-color", "--tail", "6", name, check=False).stdout
                say(f"--- {name}\n{tail[-3000:]}")
    finally:
        if cluster is not None and not args.keep:
            t0 = time.monotonic()
            cluster.down()
            timings["down_s"] = round(time.monotonic() - t0, 1)
            label = f"label=com.docker.compose.project={cluster.project}"
            for kind, argv in {
                "containers": ["docker", "ps", "-aq", "--filter", label],
                "volumes": ["docker", "volume", "ls", "-q", "--filter", label],
                "networks": ["docker", "network", "ls", "-q", "--filter", label],
            }.items():
                left = run(argv, check=False).stdout.split()
                if left:
                    say(f"{kind} left behind: {left}")
                    ok = False
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        stop_docker(daemon)
    timings["total_s"] = round(time.monotonic() - t_start, 1)
    timings["ok"] = ok
    print(json.dumps(timings))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
