"""Kubernetes sandboxes: one pod per episode, plus a NetworkPolicy that denies all traffic to and from it.

``pod_spec()`` and ``network_policy()`` are plain functions of the limits (unit-tested without a cluster).
The sandbox drives ``kubectl`` (apply, wait, exec, delete); it runs only where a cluster is configured
(``kubectl config current-context`` answers, or a kubeconfig/context is given in the options).

Kubernetes has no per-pod process limit field: the kubelet's ``podPidsLimit`` bounds it cluster-wide; the
pod spec records the wanted value in an annotation. Pods get network by default: the NetworkPolicy (which
needs a CNI that enforces policies) removes it, and the pod also has no service-account token and no
service links.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from . import _proc
from .base import KUBERNETES, ExecResult, Sandbox, SandboxLimits, classify_signal, signal_name
from .errors import FailureCause, SandboxFailure

LABEL = "rollart.io/sandbox"
DEFAULT_IMAGE = "rollart-sandbox-python:latest"


def _quantity_cpu(cores: float) -> str:
    return f"{max(1, math.ceil(cores * 1000))}m"


def pod_spec(
    name: str,
    limits: SandboxLimits,
    *,
    image: str = DEFAULT_IMAGE,
    namespace: str = "default",
    node_selector: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    run_as_user: int = 65534,
    image_pull_policy: str = "IfNotPresent",
) -> dict[str, Any]:
    """The pod of one sandbox: a sleeper container (commands run with exec) bounded by the time budget."""
    budget = max(1, math.ceil(limits.time_budget_s))
    mem = f"{limits.memory_mib}Mi"
    all_labels = {LABEL: name, "app.kubernetes.io/part-of": "rollart", **(labels or {})}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The pod ends when its budget is spent even if nobody deletes it.
        "activeDeadlineSeconds": budget + 60,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},  # no resolver reachable: names do not resolve
        "terminationGracePeriodSeconds": 0,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": run_as_user,
            "runAsGroup": run_as_user,
            "fsGroup": run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "sandbox",
                "image": image,
                "imagePullPolicy": image_pull_policy,
                "command": ["/bin/sleep", str(budget + 60)],
                "workingDir": "/workspace",
                "env": [{"name": "HOME", "value": "/workspace"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                "resources": {
                    "limits": {
                        "cpu": _quantity_cpu(limits.cpu_limit),
                        "memory": mem,
                        "ephemeral-storage": f"{limits.workspace_mib + 64}Mi",
                    },
                    "requests": {"cpu": _quantity_cpu(min(limits.cpu_limit, 0.1)), "memory": mem},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": not limits.writable_root,
                    "privileged": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": "/workspace"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {"name": "workspace", "emptyDir": {"sizeLimit": f"{limits.workspace_mib}Mi"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        ],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": all_labels,
            "annotations": {
                "rollart.io/pids-limit": str(limits.pids_limit),
                "rollart.io/step-timeout-seconds": f"{limits.step_timeout_s:g}",
                "rollart.io/time-budget-seconds": f"{limits.time_budget_s:g}",
            },
        },
        "spec": spec,
    }


def network_policy(name: str, namespace: str = "default") -> dict[str, Any]:
    """Denies all ingress and egress of the sandbox's pod."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-deny-all", "namespace": namespace, "labels": {LABEL: name}},
        "spec": {
            "podSelector": {"matchLabels": {LABEL: name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def manifest(name: str, limits: SandboxLimits, **kw: Any) -> dict[str, Any]:
    """Pod and policy as one ``kind: List`` for ``kubectl apply -f -``."""
    ns = kw.get("namespace", "default")
    return {"apiVersion": "v1", "kind": "List", "items": [network_policy(name, ns), pod_spec(name, limits, **kw)]}


def availability(kubectl: str | None = None, context: str | None = None, kubeconfig: str | None = None
                 ) -> tuple[bool, str]:
    exe = kubectl or shutil.which("kubectl")
    if exe is None:
        return False, "kubectl is not installed"
    args = [exe, *(["--kubeconfig", kubeconfig] if kubeconfig else []), "config", "current-context"]
    if context:
        return True, ""
    try:
        res = subprocess.run(args, capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"kubectl does not answer: {exc}"
    if res.returncode != 0:
        return False, "no Kubernetes cluster configured: " + res.stderr.decode(errors="replace").strip()[-200:]
    return True, ""


class KubernetesSandbox(Sandbox):
    backend = KUBERNETES
    supports_spawn = False
    workspace = "/workspace"
    python = "python3"

    def __init__(self, limits: SandboxLimits | None = None, *, sandbox_id: str | None = None,
                 options: Mapping[str, str] | None = None, kubectl: str | None = None) -> None:
        super().__init__(limits, sandbox_id=sandbox_id)
        opts = dict(options or {})
        self.namespace = opts.pop("namespace", "default")
        self.context = opts.pop("context", None)
        self.kubeconfig = opts.pop("kubeconfig", None)
        self.image = opts.pop("image", DEFAULT_IMAGE)
        self.ready_timeout = float(opts.pop("ready_timeout_s", "120"))
        selector = opts.pop("node_selector", "")
        self.node_selector = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
        self.kubectl = kubectl or shutil.which("kubectl") or "kubectl"
        self.name = f"rollart-{self.id}".lower().replace("_", "-")[:63]
        self.created = False

    def _base(self) -> list[str]:
        args = [self.kubectl]
        if self.kubeconfig:
            args += ["--kubeconfig", self.kubeconfig]
        if self.context:
            args += ["--context", self.context]
        return [*args, "-n", self.namespace]

    def _kubectl(self, args: Sequence[str], *, timeout: float, input: bytes | None = None
                 ) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([*self._base(), *args], input=input, capture_output=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise SandboxFailure(FailureCause.SETUP, f"kubectl {args[0]} timed out", backend=KUBERNETES) from exc

    def manifest(self) -> dict[str, Any]:
        return manifest(self.name, self.limits, image=self.image, namespace=self.namespace,
                        node_selector=self.node_selector)

    def _start(self) -> None:
        ok, reason = availability(self.kubectl, self.context, self.kubeconfig)
        if not ok:
            raise SandboxFailure(FailureCause.UNAVAILABLE, reason, backend=KUBERNETES)
        res = self._kubectl(["apply", "-f", "-"], timeout=60, input=json.dumps(self.manifest()).encode())
        if res.returncode != 0:
            raise SandboxFailure(FailureCause.SETUP, f"kubectl apply failed: {res.stderr.decode()[-400:]}",
                                 backend=KUBERNETES)
        self.created = True
        wait_s = min(self.ready_timeout, max(self.budget.remaining(), 1))
        res = self._kubectl(["wait", "--for=condition=Ready", f"pod/{self.name}", f"--timeout={int(wait_s)}s"],
                            timeout=wait_s + 15)
        if res.returncode != 0:
            raise SandboxFailure(FailureCause.SETUP, f"pod {self.name} not ready: {res.stderr.decode()[-400:]}",
                                 backend=KUBERNETES)

    def _cleanup(self) -> None:
        if self.created:
            self._kubectl(["delete", "pod,networkpolicy", "-l", f"{LABEL}={self.name}", "--wait=false",
                           "--grace-period=0"], timeout=60)
            self.created = False

    def _exec(self, argv: list[str], *, input: bytes | None, timeout: float | None, cwd: str | None,
              env: dict[str, str]) -> ExecResult:
        call_timeout, timeout_cause = self.call_timeout(timeout)
        inner = argv
        if cwd or env:
            # kubectl exec has no -w/-e: go through env(1) and a shell cd.
            prefix = ["env", *[f"{k}={v}" for k, v in env.items()]]
            if cwd:
                workdir = cwd if cwd.startswith("/") else os.path.join(self.workspace, cwd)
                inner = [*prefix, "sh", "-c", 'cd "$0" && exec "$@"', workdir, *argv]
            else:
                inner = [*prefix, *argv]
        args = [*self._base(), "exec", *(["-i"] if input is not None else []), self.name, "-c", "sandbox", "--",
                *inner]
        outcome = _proc.run(args, input=input, timeout=call_timeout, env=dict(os.environ))
        if outcome.timed_out:
            self._cleanup()
            failure = self._fail(timeout_cause, f"{argv[0]!r} ran past {call_timeout:.1f}s; pod deleted")
            self.failure = failure
            raise failure
        rc = outcome.returncode
        if rc == 137:
            raise self._fail(FailureCause.MEMORY, f"{argv[0]!r} was killed (OOM or SIGKILL) in pod {self.name}")
        sig = rc - 128 if 128 < rc < 160 else 0
        if sig and classify_signal(sig) is not None:
            raise self._fail(classify_signal(sig), f"{argv[0]!r} was killed by {signal_name(sig)}")  # type: ignore[arg-type]
        return ExecResult(argv=argv, exit_code=rc, stdout=outcome.stdout, stderr=outcome.stderr,
                          duration_s=outcome.duration_s, truncated=outcome.truncated)
