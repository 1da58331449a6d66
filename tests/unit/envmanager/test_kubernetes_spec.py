"""Kubernetes pod specs (no cluster needed) and the backend's behaviour where no cluster is configured."""

import json
import os
import stat

import pytest

from rollart_envmanager.sandbox import FailureCause, SandboxFailure, SandboxLimits, make_sandbox
from rollart_envmanager.sandbox.kubernetes import LABEL, KubernetesSandbox, manifest, network_policy, pod_spec


def test_pod_spec_carries_every_limit():
    limits = SandboxLimits(time_budget_s=120, step_timeout_s=10, memory_mib=512, cpu_limit=1.5, pids_limit=40,
                           workspace_mib=100)
    pod = pod_spec("rollart-abc", limits, image="img:1", namespace="sbx", node_selector={"pool": "cpu"})
    assert pod["kind"] == "Pod" and pod["metadata"]["namespace"] == "sbx"
    spec = pod["spec"]
    c = spec["containers"][0]
    assert c["image"] == "img:1"
    assert c["resources"]["limits"] == {"cpu": "1500m", "memory": "512Mi", "ephemeral-storage": "164Mi"}
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "privileged": False, "capabilities": {"drop": ["ALL"]}}
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65534
    assert spec["activeDeadlineSeconds"] == 180 and c["command"] == ["/bin/sleep", "180"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["hostNetwork"] is False and spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"pool": "cpu"}
    ws = next(v for v in spec["volumes"] if v["name"] == "workspace")
    assert ws["emptyDir"]["sizeLimit"] == "100Mi"
    assert pod["metadata"]["annotations"]["rollart.io/pids-limit"] == "40"
    assert pod["metadata"]["labels"][LABEL] == "rollart-abc"


def test_writable_root_and_policy():
    pod = pod_spec("p", SandboxLimits(writable_root=True))
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    pol = network_policy("p", "ns")
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert pol["spec"]["ingress"] == [] and pol["spec"]["egress"] == []
    assert pol["spec"]["podSelector"] == {"matchLabels": {LABEL: "p"}}
    items = manifest("p", SandboxLimits(), namespace="ns")["items"]
    assert [i["kind"] for i in items] == ["NetworkPolicy", "Pod"]
    json.dumps(items)  # serialisable as sent to kubectl


def test_unavailable_without_kubectl(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    sb = make_sandbox("kubernetes", SandboxLimits(), options={"namespace": "x"})
    with pytest.raises(SandboxFailure) as err:
        sb.start()
    assert err.value.cause is FailureCause.UNAVAILABLE


def test_drives_kubectl(tmp_path):
    # A stand-in kubectl records its calls and answers like a cluster would.
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "kubectl"
    fake.write_text(f"""#!/bin/sh
python3 -c 'import json,sys; open("{log}","a").write(json.dumps(sys.argv[1:])+"\\n")' "$@"
case "$*" in
  *" apply "*) cat > {tmp_path}/applied.json ;;
  *" exec "*) echo "ran: $*" ;;
esac
exit 0
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    sb = KubernetesSandbox(SandboxLimits(time_budget_s=60), options={"namespace": "sbx", "context": "test"},
                           kubectl=str(fake))
    with sb:
        out = sb.exec(["echo", "hi"], cwd="repo", env={"A": "1"})
    assert out.exit_code == 0 and b"ran:" in out.stdout
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    verbs = [c[c.index("sbx") + 1] for c in calls]
    assert verbs == ["apply", "wait", "exec", "delete"]
    exec_call = calls[2]
    assert exec_call[exec_call.index("--") + 1:][:2] == ["env", "A=1"]
    assert "/workspace/repo" in exec_call
    applied = json.loads((tmp_path / "applied.json").read_text())
    assert [i["kind"] for i in applied["items"]] == ["NetworkPolicy", "Pod"]
    assert os.path.exists(log)
