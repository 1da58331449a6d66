"""The Kubernetes base and every overlay, rendered (tests/unit/deploy/kustomize.py, or kubectl when installed)
and checked the way a cluster would: every object against the Kubernetes API schemas (kubernetes-validate,
offline), and the wiring between objects: ConfigMap and Secret keys a container reads exist, ports that probes
and Services name are declared, volumes and claims exist, selectors select, and each service's configuration
validates with exactly the environment its pod gets (so a key a service requires, like the weight plane's
segment key, cannot be missing)."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rollart.runtime import ports
from rollart.runtime.config import load_config
from tests.unit.deploy import kustomize

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = {"base": K8S, **{p.parent.name: p.parent for p in sorted((K8S / "overlays").glob("*/kustomization.yaml"))}}
# Oldest Kubernetes the README supports (gRPC probes GA) and the newest schemas the validator ships.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())

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
# Keys a service's configuration lets default but that a multi-pod deployment must set (why, in words).
DEPLOYMENT_REQUIRED = {
    "trainer": {
        "work_dir": "checkpoints on a persistent volume",
        "data_advertise": "relays dial this, not 0.0.0.0",
        "relays": "where deltas go",
        "ledger": "the step driver",
    },
    "relay": {"data_advertise": "subscribers dial this, not 0.0.0.0"},
    "actor": {
        "model": "what the engine serves",
        "ledger": "leases and version reports",
        "weight_source.relay_endpoint": "where deltas come from",
    },
    "ledger": {"redis_url": "its state"},
    "llmproxy": {"ledger": "step plans (the ledger is not discoverable)"},
    "envmanager": {"ledger": "leases", "llmproxy": "generation", "reward": "scoring"},
    "resource-manager": {"redis_url": "its state"},
}
# Placeholders for the downward API.
FIELD_VALUES = {"status.podIP": "10.1.2.3", "metadata.name": "pod-0", "metadata.namespace": "rollart"}


def render(name: str) -> list[dict[str, Any]]:
    return kustomize.render(OVERLAYS[name])


def documented_secrets() -> dict[str, set[str]]:
    """Secret name -> keys, from the `kubectl create secret generic` lines deploy/README.md tells users to run."""
    text = (ROOT / "deploy" / "README.md").read_text()
    secrets: dict[str, set[str]] = {}
    for m in re.finditer(r"create secret generic (\S+)((?: --from-(?:literal|file)=[^\s=]+=\S+)+)", text):
        secrets.setdefault(m.group(1), set()).update(re.findall(r"--from-(?:literal|file)=([^\s=]+)=", m.group(2)))
    return secrets


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    pod = workload["spec"]["template"]["spec"]
    return pod.get("containers", []) + pod.get("initContainers", [])


def by(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


overlay_param = pytest.mark.parametrize("overlay", list(OVERLAYS))


def test_the_overlays_exist() -> None:
    assert {"training-region", "inference-region"} <= set(OVERLAYS)


@overlay_param
def test_every_object_matches_the_kubernetes_schemas(overlay: str) -> None:
    objs = render(overlay)
    assert objs
    for version in K8S_VERSIONS:
        for obj in objs:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {exc.message}")


@overlay_param
def test_configmap_and_secret_keys_exist(overlay: str) -> None:
    objs = render(overlay)
    configmaps = {name: set(o.get("data", {})) for name, o in by(objs, "ConfigMap").items()}
    secrets = documented_secrets()
    assert secrets.get("rollart-job-token") == {"token"} and secrets.get("rollart-job-key") == {"key"}, secrets
    for w in workloads(objs):
        where = f"{overlay}: {w['kind']}/{w['metadata']['name']}"
        for c in containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    r = ref["configMapKeyRef"]
                    assert r["key"] in configmaps.get(r["name"], set()), f"{where} reads ConfigMap {r['name']}/{r['key']}"
                if "secretKeyRef" in ref:
                    r = ref["secretKeyRef"]
                    assert r["key"] in secrets.get(r["name"], set()), f"{where} reads Secret {r['name']}/{r['key']}"
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert src["configMapRef"]["name"] in configmaps, where
                if "secretRef" in src:
                    assert src["secretRef"]["name"] in secrets, where
        for v in w["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in v:
                name = v["secret"]["secretName"]
                assert name in secrets, f"{where} mounts Secret {name}, which deploy/README.md never creates"
                for item in v["secret"].get("items", []):
                    assert item["key"] in secrets[name], f"{where} mounts Secret {name}/{item['key']}"
            if "configMap" in v:
                name = v["configMap"]["name"]
                assert name in configmaps, where
                for item in v["configMap"].get("items", []):
                    assert item["key"] in configmaps[name], where
    # A key no container reads is a leftover (e.g. an overlay removing a service but not its settings).
    read = {
        e["valueFrom"]["configMapKeyRef"]["key"]
        for w in workloads(objs)
        for c in containers(w)
        for e in c.get("env", [])
        if "configMapKeyRef" in e.get("valueFrom", {})
    }
    unused = configmaps.get("rollart-config", set()) - read
    assert not unused, f"{overlay}: rollart-config keys nobody reads: {sorted(unused)}"


def _port_names(c: dict[str, Any]) -> dict[Any, int]:
    declared: dict[Any, int] = {}
    for p in c.get("ports", []):
        declared[p["containerPort"]] = p["containerPort"]
        if "name" in p:
            declared[p["name"]] = p["containerPort"]
    return declared


@overlay_param
def test_probe_and_service_ports_are_declared(overlay: str) -> None:
    objs = render(overlay)
    pods = [(w, w["spec"]["template"]["metadata"].get("labels", {})) for w in workloads(objs)]
    for w in workloads(objs):
        for c in containers(w):
            declared = _port_names(c)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = c.get(probe)
                if not spec:
                    continue
                for handler in ("grpc", "httpGet", "tcpSocket"):
                    if handler in spec:
                        port = spec[handler]["port"]
                        assert port in declared, f"{overlay}: {w['metadata']['name']} {probe} port {port} undeclared"
    for name, svc in by(objs, "Service").items():
        selector = svc["spec"].get("selector", {})
        selected = [w for w, labels in pods if selector and all(labels.get(k) == v for k, v in selector.items())]
        assert selected, f"{overlay}: Service {name} selects no workload"
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            for w in selected:
                assert any(target in _port_names(c) for c in containers(w)), (
                    f"{overlay}: Service {name} targets {target}, which {w['metadata']['name']} does not declare"
                )
    for name, pdb in by(objs, "PodDisruptionBudget").items():
        match = pdb["spec"]["selector"]["matchLabels"]
        assert any(all(labels.get(k) == v for k, v in match.items()) for _, labels in pods), f"PDB {name} selects nothing"
    for name, hpa in by(objs, "HorizontalPodAutoscaler").items():
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["name"] in by(objs, ref["kind"]), f"{overlay}: HPA {name} scales a missing {ref['kind']}"


@overlay_param
def test_volumes_and_claims_exist(overlay: str) -> None:
    objs = render(overlay)
    claims = set(by(objs, "PersistentVolumeClaim"))
    for w in workloads(objs):
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        templates = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for c in containers(w):
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in templates, f"{w['metadata']['name']} mounts {m['name']}"
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, f"{overlay}: claim {v} missing"


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def pod_environment(objs: list[dict[str, Any]], w: dict[str, Any], c: dict[str, Any], tmp: Path) -> dict[str, str]:
    """The container's environment as the kubelet builds it; files under mounted Secrets become temp files."""
    configmaps = {n: o.get("data", {}) for n, o in by(objs, "ConfigMap").items()}
    volumes = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes", [])}
    secret_files: dict[str, Path] = {}
    for m in c.get("volumeMounts", []):
        secret = volumes.get(m["name"], {}).get("secret")
        if secret:
            for item in secret.get("items", []):
                f = tmp / m["name"] / item["path"]
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text("0123456789abcdef0123456789abcdef\n")
                secret_files[f"{m['mountPath'].rstrip('/')}/{item['path']}"] = f
    env: dict[str, str] = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {})
        if "value" in e:
            value = _expand(str(e["value"]), env)
        elif "configMapKeyRef" in ref:
            value = str(configmaps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]])
        elif "secretKeyRef" in ref:
            value = "0123456789abcdef0123456789abcdef"
        elif "fieldRef" in ref:
            value = FIELD_VALUES[ref["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"unhandled env source {e}")
        env[e["name"]] = str(secret_files.get(value, value))
    return env


@overlay_param
def test_each_service_configuration_validates_with_its_pod_environment(overlay: str, tmp_path: Path) -> None:
    objs = render(overlay)
    deployments = by(objs, "Deployment")
    checked = 0
    for service, dotted in CONFIG_CLASSES.items():
        if service not in deployments:
            continue
        module, _, cls_name = dotted.partition(":")
        config_cls = getattr(importlib.import_module(module), cls_name)
        w = deployments[service]
        c = next(c for c in containers(w) if c["name"] == service)
        env = pod_environment(objs, w, c, tmp_path / service)
        cfg = load_config(config_cls, None, env)  # raises ConfigError naming a missing or bad key
        assert cfg.listen == f"0.0.0.0:{ports.GRPC_PORTS[service]}"
        for key, why in DEPLOYMENT_REQUIRED.get(service, {}).items():
            value: Any = cfg
            for part in key.split("."):
                value = getattr(value, part)
            assert value, f"{overlay}: {service} leaves {key} unset ({why})"
        if hasattr(cfg, "key"):
            assert cfg.key(), f"{overlay}: {service} has no segment key"
        checked += 1
    assert checked == len([s for s in CONFIG_CLASSES if s in deployments]) > 0


@overlay_param
def test_probes_resources_and_disruption_budgets(overlay: str) -> None:
    objs = render(overlay)
    for w in workloads(objs):
        for c in containers(w):
            name = f"{overlay}: {w['metadata']['name']}/{c['name']}"
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{name} has no cpu/memory requests"
            assert "memory" in res.get("limits", {}), f"{name} has no memory limit"
            if c["name"] in CONFIG_CLASSES:
                assert "startupProbe" in c, f"{name} has no startupProbe (liveness would kill a slow start)"
    deployments = by(objs, "Deployment")
    if "actor" in deployments:
        probe = next(c for c in containers(deployments["actor"]) if c["name"] == "actor")["startupProbe"]
        # vLLM loads weights and compiles kernels on CPU: allow at least 10 minutes.
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 600
    pdbs = {p["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") for p in by(objs, "PodDisruptionBudget").values()}
    for service in ("ledger", "relay"):
        if service in deployments:
            assert service in pdbs, f"{overlay}: no PodDisruptionBudget for {service}"


@overlay_param
def test_state_survives_a_rescheduled_pod(overlay: str) -> None:
    objs = render(overlay)
    deployments = by(objs, "Deployment")
    if "trainer" in deployments:
        w = deployments["trainer"]
        c = next(c for c in containers(w) if c["name"] == "trainer")
        env = {e["name"]: e.get("value") for e in c["env"]}
        volumes = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == env["ROLLART_WORK_DIR"])
        assert "persistentVolumeClaim" in volumes[mount["name"]], "the trainer's checkpoints are not on a PVC"
    redis = by(objs, "StatefulSet").get("redis")
    if redis:
        c = containers(redis)[0]
        assert "--appendonly" in c["args"] and "/data" in c["args"]
        data = next(m for m in c["volumeMounts"] if m["mountPath"] == "/data")
        assert data["name"] in {t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]}


def test_each_region_has_its_own_relay() -> None:
    training, inference = render("training-region"), render("inference-region")
    t_config = by(training, "ConfigMap")["rollart-config"]["data"]
    i_config = by(inference, "ConfigMap")["rollart-config"]["data"]
    assert (t_config["region"], i_config["region"]) == ("training", "inference")
    # The inference region runs actors and a relay, nothing stateful.
    assert set(by(inference, "Deployment")) == {"actor", "relay"}
    assert not by(inference, "StatefulSet")
    relay_env = {e["name"]: e for e in containers(by(inference, "Deployment")["relay"])[0]["env"]}
    assert relay_env["ROLLART_UPSTREAM__KIND"]["value"] == "relay"
    upstream = relay_env["ROLLART_UPSTREAM__ENDPOINT"]["valueFrom"]["configMapKeyRef"]["key"]
    assert i_config[upstream].startswith("relay.") and i_config[upstream].endswith(":50053")
    # Actors in each region take deltas from their own region's relay Service.
    for objs, config in ((training, t_config), (inference, i_config)):
        assert config["relay-address"] == "relay:50053" and "relay" in by(objs, "Service")
    # What the inference region dials in the training region is reachable from outside that cluster.
    for service in ("resource-manager", "ledger", "trainer", "relay"):
        assert by(training, "Service")[service]["spec"]["type"] == "LoadBalancer"
    assert json.loads(i_config["actor-fallback-endpoints"])[0].startswith("trainer.")


@overlay_param
def test_kubectl_renders_the_same(overlay: str) -> None:
    if shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", str(OVERLAYS[overlay])]
    elif shutil.which("kustomize"):
        cmd = ["kustomize", "build", str(OVERLAYS[overlay])]
    else:
        pytest.skip("neither kubectl nor kustomize is installed (the Python renderer is checked above)")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    theirs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    ours = {(d["kind"], d["metadata"]["name"]): d for d in render(overlay)}
    assert theirs == ours
