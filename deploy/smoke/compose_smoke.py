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
        if problems:
            raise SmokeFailure(f"bad input '{name}': {', '.join(problems)}; output:\n{text[-2000:]}")
        line = next(ln for ln in lines if needles[0] in ln)
        results[name] = line.strip()[:200]
        say(f"bad input '{name}': exit {proc.returncode}: {results[name]}")
    return results


async def run_job(steps: int, loops: int, tls_cfg: Any, token: str, timeout: float) -> dict[str, Any]:
    """StartJob + StartLoops from the host, then wait for `steps` versions with both actors on the newest."""
    from rollart.job.spec import environment_spec, job_spec, load_job_file
    from rollart.runtime.client import channel
    from rollart.v1 import (
        envmanager_pb2,
        envmanager_pb2_grpc,
        ledger_pb2,
        ledger_pb2_grpc,
        trainer_pb2,
        trainer_pb2_grpc,
    )

    data = load_job_file(REPO / "examples" / "frozenlake.yaml")
    spec = job_spec(data["job"])
    spec.job_id = JOB_ID
    spec.max_steps = steps + 5  # the job is still running when the check passes
    spec.batch_size, spec.group_size = 16, 4
    spec.model = MODEL_IN_CONTAINERS
    spec.endpoints.ledger = f"127.0.0.1:{PORTS['ledger']}"
    spec.endpoints.llmproxy = f"127.0.0.1:{PORTS['llmproxy']}"
    del spec.publish.relay_endpoints[:]
    spec.publish.relay_endpoints.append(f"127.0.0.1:{PORTS['relay']}")
    spec.publish.mooncake_master = MOONCAKE
    spec.publish.checkpoint_store = WEIGHTS_IN_CONTAINERS
    env_spec = environment_spec(data["environment"])

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
    parser.add_argument("--healthy-timeout", type=float, default=900)
    parser.add_argument("--job-timeout", type=float, default=600)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (debugging)")
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
        try:
            cluster("up", "-d", "--no-build", timeout=1200)
        except SmokeFailure as exc:
            raise SmokeFailure(f"{exc}\n{cluster.logs()}") from None
        timings["healthy_s"] = round(cluster.wait_healthy(args.healthy_timeout), 1)
        say(f"every container healthy after {timings['healthy_s']}s")
        if args.tls != "none":
            timings["bad_input"].update(bad_input_checks(args.tag, other_pki, ["wrong certificate"]))
        timings["job"] = asyncio.run(run_job(args.steps, args.loops, tls_cfg, token, args.job_timeout))
        cluster.wait_healthy(60)  # still all healthy with the job running
        timings["cluster_s"] = round(time.monotonic() - t0, 1)
        ok = True
    except Exception as exc:  # noqa: BLE001 - any failure is reported, then everything is removed
        say(f"FAILED: {type(exc).__name__}: {exc}")
    finally:
        if cluster is not None and not args.keep:
            t0 = time.monotonic()
            cluster.down()
            timings["down_s"] = round(time.monotonic() - t0, 1)
            left = run(
                ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={cluster.project}"], check=False
            ).stdout.split()
            if left:
                say(f"containers left behind: {left}")
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
