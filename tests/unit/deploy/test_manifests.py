"""Deployment descriptions: every service has an image target, a compose service and Kubernetes objects.

Parses deploy/docker/Dockerfile, docker-compose.yml and the kustomize base in deploy/k8s and checks them
against one table of services and ports (``rollart.runtime.ports``, which also gives the services' default
``listen``), so a service added to one place but not the others fails here; the port tables in
deploy/README.md and docs/architecture.md are checked against it too.
`docker-compose config` / `docker compose config` and `kubectl kustomize` are run when installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollart.runtime import ports

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s" / "base"  # deploy/k8s/kustomization.yaml only points at it

# service -> gRPC port (the one table, rollart.runtime.ports); console entry point is rollart-<service>,
# package folder services/<service>.
SERVICES: dict[str, int] = ports.GRPC_PORTS
EXTRA_PORTS: dict[str, dict[str, int]] = ports.EXTRA_PORTS
METRICS_PORT = ports.METRICS_PORT
NO_TORCH = ("relay", "resource-manager", "ledger", "llmproxy")
REDIS_DB = {"resource-manager": 0, "ledger": 1}
TOKEN_SECRET = "rollart-job-token"

service_param = pytest.mark.parametrize("service", list(SERVICES))


# ----------------------------------------------------------------------------------------------------
# Dockerfile
# Parsed once per session and shared read-only by the tests (@cache).


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a line continuation"
    return out


@cache
def _parse_dockerfile() -> tuple[list[tuple[str, str]], dict[str, dict[str, Any]]]:
    """Global instructions (before the first FROM) and stages by name: {'from': image, 'ins': [...]}."""
    global_ins: list[tuple[str, str]] = []
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for keyword, args in _instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert m and m.group(2), f"every stage needs a name: FROM {args}"
            name = m.group(2).lower()
            assert name not in stages, f"duplicate stage {name}"
            current = stages[name] = {"from": m.group(1), "ins": []}
        elif current is None:
            global_ins.append((keyword, args))
        else:
            current["ins"].append((keyword, args))
    return global_ins, stages


def _stage_chain(stages: dict[str, dict[str, Any]], name: str) -> list[str]:
    """The stage and its ancestors within this Dockerfile, nearest first."""
    chain = [name]
    while stages[chain[-1]]["from"].lower() in stages:
        chain.append(stages[chain[-1]]["from"].lower())
        assert len(chain) <= len(stages), "stage cycle"
    return chain


def _exec_form(args: str) -> list[str]:
    args = args.strip()
    if args.startswith("["):
        return yaml.safe_load(args)  # a JSON array is valid YAML
    return shlex.split(args)


def test_dockerfile_declares_base_image_argument() -> None:
    global_ins, stages = _parse_dockerfile()
    args = {a.split("=", 1)[0]: (a.split("=", 1) + [""])[1] for k, a in global_ins if k == "ARG"}
    assert args.get("BASE_IMAGE", "").strip("\"'") == "python:3.11-slim"
    roots = [name for name, st in stages.items() if st["from"] in ("${BASE_IMAGE}", "$BASE_IMAGE")]
    assert roots, "no stage is built FROM ${BASE_IMAGE}"
    for service in SERVICES:
        chain = _stage_chain(stages, service)
        assert stages[chain[-1]]["from"] in ("${BASE_IMAGE}", "$BASE_IMAGE"), (
            f"{service} does not derive from BASE_IMAGE: {' <- '.join(chain)}"
        )


@service_param
def test_dockerfile_target(service: str) -> None:
    _, stages = _parse_dockerfile()
    assert service in stages, f"no Dockerfile target {service}; targets: {sorted(stages)}"
    port = SERVICES[service]
    ins = stages[service]["ins"]
    chain_ins = [i for name in reversed(_stage_chain(stages, service)) for i in stages[name]["ins"]]

    copies = [a for k, a in chain_ins if k == "COPY"]
    assert any(a.split()[0].rstrip("/") == "libs" for a in copies), "libs/ is not copied"
    own_copies = [a for k, a in ins if k == "COPY"]
    assert any(a.split()[0].rstrip("/") == f"services/{service}" for a in own_copies), (
        f"services/{service}/ is not copied into the {service} target"
    )
    installs = [a for k, a in ins if k == "RUN" and "pip install" in a]
    assert any("./libs" in a and re.search(rf"\./services/{re.escape(service)}\b", a) for a in installs), (
        f"the {service} target does not pip install ./libs and ./services/{service}"
    )

    entry = [a for k, a in chain_ins if k == "ENTRYPOINT"]
    assert entry and _exec_form(entry[-1]) == [f"rollart-{service}"]

    exposed = {int(p.split("/")[0]) for k, a in chain_ins if k == "EXPOSE" for p in a.split()}
    assert {port, METRICS_PORT, *EXTRA_PORTS.get(service, {}).values()} <= exposed

    health = [a for k, a in ins if k == "HEALTHCHECK"]
    assert health, f"{service} target has no HEALTHCHECK"
    cmd = health[-1].split(" CMD ", 1)[1]
    assert _exec_form(cmd) == ["rollart", "health", "--address", f"127.0.0.1:{port}"]

    env = " ".join(a for k, a in chain_ins if k == "ENV")
    assert f"ROLLART_LISTEN=0.0.0.0:{port}" in env
    assert f"ROLLART_METRICS_LISTEN=0.0.0.0:{METRICS_PORT}" in env

    users = [a for k, a in chain_ins if k == "USER"]
    assert users and users[-1] not in ("root", "0"), f"{service} image runs as root"


@pytest.mark.parametrize("service", NO_TORCH)
def test_dockerfile_lean_targets_never_install_torch(service: str) -> None:
    _, stages = _parse_dockerfile()
    for name in _stage_chain(stages, service):
        for keyword, args in stages[name]["ins"]:
            if keyword in ("RUN", "ARG", "ENV"):
                # The guard below names torch and vllm to refuse them; anything else must not.
                text = re.sub(r'python -c "[^"]*find_spec[^"]*"', "", args)
                assert not re.search(r"torch|vllm", text, re.IGNORECASE), (
                    f"stage {name} (of {service}) mentions torch/vllm: {args}"
                )
    # The build itself fails if a dependency pulls torch or vllm in transitively.
    runs = [a for k, a in stages[service]["ins"] if k == "RUN"]
    assert any("find_spec" in a and "'torch'" in a and "'vllm'" in a and "sys.exit" in a for a in runs)


def _stage_args(stage: dict[str, Any]) -> dict[str, str]:
    args = {}
    for keyword, text in stage["ins"]:
        if keyword == "ARG":
            name, _, default = text.partition("=")
            args[name] = default.strip("\"'")
    return args


def _pyproject(service: str) -> dict[str, Any]:
    path = ROOT / "services" / service / "pyproject.toml"
    if not path.is_file():
        pytest.skip(f"services/{service}/pyproject.toml does not exist yet")
    return tomllib.loads(path.read_text())["project"]


@service_param
def test_service_package_matches_its_image(service: str) -> None:
    project = _pyproject(service)
    if not project.get("scripts"):
        pytest.skip(f"services/{service} declares no console script yet (its server is not written)")
    assert f"rollart-{service}" in project["scripts"], "the image's ENTRYPOINT is not a console script"
    if service in NO_TORCH:
        direct = [d for d in project.get("dependencies", []) if re.match(r"\s*(torch|vllm)", d, re.IGNORECASE)]
        assert not direct, f"{service} must not depend on torch/vllm: {direct}"


def test_actor_image_installs_vllm_by_default() -> None:
    _, stages = _parse_dockerfile()
    extras = _stage_args(stages["actor"]).get("PIP_EXTRAS", "")
    project = _pyproject("actor")
    deps = list(project.get("dependencies", []))
    for extra in filter(None, extras.strip("[]").split(",")):
        assert extra.strip() in project.get("optional-dependencies", {}), f"actor has no extra {extra}"
        deps += project["optional-dependencies"][extra.strip()]
    assert any(re.match(r"vllm", d) for d in deps), f"actor image with extras {extras!r} installs no vllm"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    # Allow-list: exclude everything, then re-include only what the images copy.
    assert patterns[0] == "*" and {"!libs/", "!services/"} <= set(patterns), patterns


# ----------------------------------------------------------------------------------------------------
# docker-compose.yml


@cache
def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@cache
def _compose_override() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.override.yml").read_text())


def _env(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: str(v) for k, v in env.items()}


def _depends(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    dep = spec.get("depends_on") or {}
    return {d: {} for d in dep} if isinstance(dep, list) else dep


def _health_cmd(spec: dict[str, Any]) -> list[str]:
    test = spec["healthcheck"]["test"]
    if isinstance(test, str):
        return shlex.split(test)
    if test[0] == "CMD-SHELL":
        return shlex.split(test[1])
    assert test[0] == "CMD", f"unexpected healthcheck form {test}"
    return list(test[1:])


def test_compose_redis() -> None:
    redis = _compose()["services"]["redis"]
    assert redis["image"] == "redis:7"
    command = redis["command"] if isinstance(redis["command"], list) else shlex.split(redis["command"])
    assert " ".join(command).find("--appendonly yes") >= 0
    assert "redis-cli" in _health_cmd(redis) and "ping" in _health_cmd(redis)
    assert any(str(v).endswith(":/data") for v in redis.get("volumes", [])), "redis data is not persisted"


@service_param
def test_compose_service(service: str) -> None:
    services = _compose()["services"]
    assert service in services, f"compose lacks {service}"
    spec = services[service]
    port = SERVICES[service]

    build = spec["build"]
    assert build["target"] == service
    assert (ROOT / build.get("context", ".") / build["dockerfile"]).resolve() == DOCKERFILE
    assert "BASE_IMAGE" in build.get("args", {})
    assert spec["image"].split(":")[0] == f"rollart/{service}"

    assert _health_cmd(spec) == ["rollart", "health", "--address", f"127.0.0.1:{port}"]

    env = _env(spec)
    assert env["ROLLART_LISTEN"] == f"0.0.0.0:{port}"
    assert env["ROLLART_METRICS_LISTEN"] == f"0.0.0.0:{METRICS_PORT}"
    assert env["ROLLART_LOG_FORMAT"] == "json"
    assert env["ROLLART_JOB_TOKEN"].startswith("${ROLLART_JOB_TOKEN:?"), "the job token must not default"
    if service in REDIS_DB:
        assert env["ROLLART_REDIS_URL"] == f"redis://redis:6379/{REDIS_DB[service]}"
    else:
        assert "ROLLART_REDIS_URL" not in env
    if service != "resource-manager":
        assert env["ROLLART_RESOURCE_MANAGER"] == f"resource-manager:{SERVICES['resource-manager']}"

    deps = _depends(spec)
    required = {"redis"} if service == "resource-manager" else {"resource-manager"}
    if service == "ledger":
        required.add("redis")
    assert required <= set(deps), f"{service} must wait for {required - set(deps)}"
    for dep, cond in deps.items():
        if cond.get("condition") == "service_completed_successfully":  # a one-shot job (the model build)
            assert str(services[dep].get("restart")) == "no", f"{service} waits for {dep} to end, but it restarts"
            continue
        assert cond.get("condition") == "service_healthy", f"{service} -> {dep} is not service_healthy"
        assert "healthcheck" in services[dep], f"{service} waits for {dep}, which has no healthcheck"

    # Published ports live in docker-compose.override.yml (read by a plain `docker compose up`), so that the
    # host-network override docker-compose.local.yml can be combined with docker-compose.yml.
    assert "ports" not in spec, f"{service}: publish ports in docker-compose.override.yml"
    published_spec = _compose_override()["services"][service].get("ports", [])
    published = {str(p).split(":")[-1].split("/")[0] for p in published_spec}
    assert str(port) in published
    assert all(str(p).startswith("127.0.0.1:") for p in published_spec), "publish on loopback only"


def test_compose_dependencies_are_acyclic() -> None:
    services = _compose()["services"]
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on cycle: {' -> '.join(path + (name,))}"
        if name in done:
            return
        for dep in _depends(services[name]):
            assert dep in services, f"{name} depends on unknown service {dep}"
            visit(dep, path + (name,))
        done.add(name)

    for name in services:
        visit(name, ())


def _compose_commands() -> list[list[str]]:
    found = []
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], check=False, capture_output=True, timeout=30)
        if probe.returncode == 0:
            found.append(["docker", "compose"])
    return found


def test_compose_config_is_valid() -> None:
    commands = _compose_commands()
    if not commands:
        pytest.skip(
            "neither docker-compose nor the docker compose plugin is installed "
            "(apt-get install docker-compose provides one)"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLART_", "COMPOSE_"))}
    for cmd in commands:
        base = [*cmd, "--project-directory", str(ROOT), "-f", str(COMPOSE)]
        ok = subprocess.run(
            [*base, "config"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "ROLLART_JOB_TOKEN": "test-token", "ROLLART_JOB_KEY": "test-key"},
            cwd=ROOT,
        )
        assert ok.returncode == 0, f"{' '.join(cmd)} config failed:\n{ok.stderr}"
        rendered = yaml.safe_load(ok.stdout)
        assert set(SERVICES) | {"redis"} <= set(rendered["services"])
        assert _env(rendered["services"]["reward"])["ROLLART_JOB_TOKEN"] == "test-token"
        # Without a token the file must refuse to render rather than fall back to a guessable default.
        missing = subprocess.run(
            [*base, "config", "-q"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=ROOT,
        )
        assert missing.returncode != 0 and "ROLLART_JOB_TOKEN" in missing.stdout + missing.stderr


# ----------------------------------------------------------------------------------------------------
# Kubernetes (kustomize base)


@cache
def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@cache
def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for resource in _kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / resource).read_text()) if d]
    return docs


@cache
def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for doc in _k8s_docs():
        if doc["kind"] == kind:
            name = doc["metadata"]["name"]
            assert name not in found, f"duplicate {kind} {name}"
            found[name] = doc
    return found


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert name in containers, f"deployment has no container {name}: {sorted(containers)}"
    return containers[name]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_kustomization_lists_every_manifest() -> None:
    listed = _kustomization()["resources"]
    for resource in listed:
        assert (K8S / resource).is_file(), f"kustomization lists missing {resource}"
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == set(listed), f"manifests not in kustomization: {sorted(on_disk - set(listed))}"
    images = {i["name"] for i in _kustomization().get("images", [])}
    assert {f"rollart/{s}" for s in SERVICES} <= images


@service_param
def test_k8s_deployment(service: str) -> None:
    deployments = _by_kind("Deployment")
    assert service in deployments, f"no Deployment {service}"
    dep = deployments[service]
    port = SERVICES[service]
    pod = dep["spec"]["template"]
    assert _selects(dep["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    c = _container(dep, service)
    assert c["image"].split(":")[0] == f"rollart/{service}"

    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == port
    # /metrics is unauthenticated: the base keeps it on the pod's loopback, neither declared nor scraped.
    assert "metrics" not in ports and METRICS_PORT not in ports.values()
    assert not any(k.startswith("prometheus.io/") for k in pod["metadata"].get("annotations", {}))
    for name, number in EXTRA_PORTS.get(service, {}).items():
        assert ports.get(name) == number

    # Native gRPC probes against grpc.health.v1 on the service's own port.
    for kind in ("readinessProbe", "livenessProbe"):
        grpc = c.get(kind, {}).get("grpc", {})
        assert grpc.get("port") == port, f"{service} {kind} is not a gRPC probe on {port}: {c.get(kind)}"
        assert not grpc.get("service"), "probe the whole server (empty service name)"
    if "startupProbe" in c:
        assert c["startupProbe"]["grpc"]["port"] == port

    env = {e["name"]: e for e in c["env"]}
    assert env["ROLLART_LISTEN"]["value"] == f"0.0.0.0:{port}"
    assert env.get("ROLLART_RESOURCE_MANAGER") if service != "resource-manager" else True
    assert ("ROLLART_REDIS_URL" in env) == (service in REDIS_DB)
    assert "value" not in env.get("ROLLART_JOB_TOKEN", {}), "the job token must come from the Secret"
    assert pod["spec"].get("securityContext", {}).get("runAsUser") != 0


def _configmap_value(ref: dict[str, Any]) -> str:
    configmaps = _by_kind("ConfigMap")
    assert ref["name"] in configmaps, f"unknown ConfigMap {ref['name']}"
    data = configmaps[ref["name"]]["data"]
    assert ref["key"] in data, f"ConfigMap {ref['name']} has no key {ref['key']}"
    return str(data[ref["key"]])


@service_param
def test_k8s_shared_config_and_token(service: str) -> None:
    dep = _by_kind("Deployment")[service]
    c = _container(dep, service)
    env = {e["name"]: e for e in c["env"]}
    resolved = {
        name: _configmap_value(e["valueFrom"]["configMapKeyRef"])
        for name, e in env.items()
        if "configMapKeyRef" in e.get("valueFrom", {})
    }
    assert resolved.get("ROLLART_METRICS_LISTEN") == f"127.0.0.1:{METRICS_PORT}"
    assert resolved.get("ROLLART_LOG_FORMAT") == "json"
    if service in REDIS_DB:
        assert resolved["ROLLART_REDIS_URL"] == f"redis://redis:6379/{REDIS_DB[service]}"
    if service != "resource-manager":
        assert resolved["ROLLART_RESOURCE_MANAGER"] == f"resource-manager:{SERVICES['resource-manager']}"

    # The token: either ROLLART_JOB_TOKEN from a secretKeyRef or a file from a mounted Secret volume.
    token = env.get("ROLLART_JOB_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
    if token:
        assert token["name"] == TOKEN_SECRET
        return
    path = Path(env["ROLLART_JOB_TOKEN_FILE"]["value"])
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = [m for m in c["volumeMounts"] if path.parent == Path(m["mountPath"])]
    assert mounts, f"{path} is not inside a mounted volume"
    secret = volumes[mounts[0]["name"]]["secret"]
    assert secret["secretName"] == TOKEN_SECRET
    # The Secret's key is `token` (deploy/README.md); items may map it to another file name.
    items = {i["path"]: i["key"] for i in secret.get("items", [])}
    assert items.get(path.name) == "token" if items else path.name == "token"


def test_k8s_token_is_referenced_not_committed() -> None:
    for secret in _by_kind("Secret").values():
        assert not secret.get("data") and not secret.get("stringData"), "a token is committed in the base"


@service_param
def test_k8s_service(service: str) -> None:
    svc = _by_kind("Service").get(service)
    assert svc, f"no Service {service}"
    pod = _by_kind("Deployment")[service]["spec"]["template"]
    assert _selects(svc["spec"]["selector"], pod["metadata"]["labels"]), f"Service {service} selects no pod"
    container_ports = {p["name"]: p["containerPort"] for p in _container({"spec": {"template": pod}}, service)["ports"]}
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    expected = {"grpc": SERVICES[service], **EXTRA_PORTS.get(service, {})}
    assert "metrics" not in ports and all(p["port"] != METRICS_PORT for p in ports.values())
    for name, number in expected.items():
        assert ports[name]["port"] == number
        target = ports[name].get("targetPort", number)
        assert container_ports.get(target, target) == number, f"{service}:{name} targets {target}"


def test_k8s_reward_autoscaler() -> None:
    hpas = [h for h in _by_kind("HorizontalPodAutoscaler").values() if h["spec"]["scaleTargetRef"]["name"] == "reward"]
    assert len(hpas) == 1, "reward needs exactly one HorizontalPodAutoscaler"
    hpa = hpas[0]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert 0 <= hpa["spec"].get("minReplicas", 1) < hpa["spec"]["maxReplicas"]
    reward = _by_kind("Deployment")["reward"]
    assert "replicas" not in reward["spec"], "a fixed replica count fights the autoscaler on every apply"
    if any(m.get("resource", {}).get("name") == "cpu" for m in hpa["spec"]["metrics"]):
        assert _container(reward, "reward")["resources"]["requests"]["cpu"], "CPU utilisation needs a request"


def test_k8s_redis() -> None:
    workloads = {**_by_kind("StatefulSet"), **_by_kind("Deployment")}
    assert "redis" in workloads
    redis = workloads["redis"]
    c = _container(redis, "redis")
    assert c["image"].startswith("redis:7")
    assert "--appendonly yes" in " ".join(c.get("command", []) + c.get("args", []))
    svc = _by_kind("Service")["redis"]
    assert any(p["port"] == 6379 for p in svc["spec"]["ports"])
    assert _selects(svc["spec"]["selector"], redis["spec"]["template"]["metadata"]["labels"])
    if redis["kind"] == "StatefulSet":
        assert redis["spec"]["serviceName"] in _by_kind("Service")


def test_kustomize_renders() -> None:
    if shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", str(K8S)]
    elif shutil.which("kustomize"):
        cmd = ["kustomize", "build", str(K8S)]
    else:
        pytest.skip("neither kubectl nor kustomize is installed")
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    namespace = _kustomization().get("namespace")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(SERVICES) <= set(deployments)
    for name, dep in deployments.items():
        if namespace:
            assert dep["metadata"]["namespace"] == namespace
        image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
        assert ":" in image, f"{name} renders an untagged image {image}"


# ----------------------------------------------------------------------------------------------------
# The port table: code defaults, compose's weight plane wiring and the docs agree with rollart.runtime.ports

CONFIG_CLASSES = {
    "resource-manager": "rollart_resource_manager.config:ResourceManagerConfig",
    "ledger": "rollart_ledger.config:LedgerConfig",
    "relay": "rollart_relay.config:RelayConfig",
    "trainer": "rollart_trainer.config:TrainerConfig",
    "actor": "rollart_actor.config:ActorConfig",
    "llmproxy": "rollart_llmproxy.config:LLMProxyConfig",
    "envmanager": "rollart_envmanager.config:EnvManagerConfig",
    "reward": "rollart_reward.config:RewardConfig",
}


def test_the_port_table_covers_every_service() -> None:
    assert set(CONFIG_CLASSES) == set(ports.GRPC_PORTS)
    assert {p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").is_file()} == set(ports.GRPC_PORTS)
    numbers = list(ports.GRPC_PORTS.values()) + [n for extra in ports.EXTRA_PORTS.values() for n in extra.values()]
    numbers += [ports.data_port("trainer"), ports.METRICS_PORT, ports.MOONCAKE_MASTER_PORT]
    assert len(numbers) == len(set(numbers)), "two services share a default port"


@service_param
def test_config_default_listen_is_the_tables(service: str) -> None:
    import importlib

    module, _, name = CONFIG_CLASSES[service].partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:  # a service not installed in this environment
        pytest.skip(f"{module}: {exc}")
    assert cls.model_fields["listen"].default == ports.listen(service)


def test_compose_weight_plane_ports() -> None:
    services = _compose()["services"]
    relay, trainer = _env(services["relay"]), _env(services["trainer"])
    relay_data, trainer_data = ports.data_port("relay"), ports.data_port("trainer")
    assert relay["ROLLART_DATA_LISTEN"] == f"0.0.0.0:{relay_data}"
    assert relay["ROLLART_DATA_ADVERTISE"] == f"relay:{relay_data}"
    assert trainer["ROLLART_DATA_LISTEN"] == f"0.0.0.0:{trainer_data}"
    assert trainer["ROLLART_DATA_ADVERTISE"] == f"trainer:{trainer_data}"
    assert f"relay:{ports.GRPC_PORTS['relay']}" in trainer["ROLLART_RELAYS"]
    for name, spec in services.items():
        env = _env(spec)
        for key, value in env.items():
            # Every host:port naming a RollArt service uses that service's port from the table.
            for host, port in re.findall(r"\b([a-z][a-z-]*):(\d{4,5})\b", str(value)):
                if host in ports.GRPC_PORTS:
                    assert int(port) in (ports.GRPC_PORTS[host], *ports.EXTRA_PORTS.get(host, {}).values()) or (
                        host == "trainer" and int(port) == trainer_data
                    ), f"compose {name}.{key}={value}: {host} is not on {port}"


def _markdown_rows(path: Path, header_cell: str) -> list[list[str]]:
    """Rows (cells stripped of backquotes) of the first Markdown table whose header has ``header_cell``."""
    rows: list[list[str]] = []
    inside = False
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if not inside:
            inside = header_cell in cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def test_deploy_readme_port_table() -> None:
    rows = _markdown_rows(ROOT / "deploy" / "README.md", "gRPC")
    table = {r[0]: r for r in rows}
    assert list(table) == list(ports.GRPC_PORTS), "deploy/README.md lists the services in the table's order"
    for service, (_, entry, grpc_port, other) in table.items():
        assert entry == f"rollart-{service}"
        assert int(grpc_port) == ports.GRPC_PORTS[service]
        extras = set(ports.EXTRA_PORTS.get(service, {}).values()) | (
            {ports.data_port("trainer")} if service == "trainer" else set()
        )
        assert {int(n) for n in re.findall(r"\b\d{4,5}\b", other)} == extras, f"{service}: {other!r}"


def test_architecture_doc_port_table() -> None:
    rows = _markdown_rows(ROOT / "docs" / "architecture.md", "default port")
    table = {r[0]: r[3] for r in rows}
    assert set(table) == set(ports.GRPC_PORTS)
    for service, cell in table.items():
        assert int(re.match(r"\d+", cell).group()) == ports.GRPC_PORTS[service], f"docs/architecture.md {service}"
