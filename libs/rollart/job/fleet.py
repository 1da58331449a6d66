"""``rollart run JOB.yaml --fleet RUN_DIR``: a LoRA job on the actors of a running cluster (several jobs on one
fleet, docs/lora.md).

The joining job starts its own trainer, ledger, relay, reward and envmanager (in its own cluster folder, with the
fleet's bearer token so that both sides accept each other's calls, and its own segment key); it has no actors and
no LLMProxy of its own. Its envmanager and trainer call the fleet's LLMProxy naming the job
(``ROLLART_LLMPROXY_JOB_ID``). Once the job has started (its version 0 is in its checkpoint store), every fleet
actor is asked to ``AttachJob`` (the job's key, adapter settings, store, relay and ledger); at the end, to
``DetachJob``. The fleet's own job is never touched.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from grpc import aio

from rollart.local import cluster as local
from rollart.local.processes import ProcessError, pid_alive
from rollart.local.supervisor import base_name
from rollart.runtime.client import channel
from rollart.v1 import actor_pb2, actor_pb2_grpc, trainer_pb2

# The services a joining job runs itself (the fleet brings the actors and the LLMProxy).
JOB_SERVICES = ["ledger", "relay", "trainer", "reward", "envmanager"]


class Fleet:
    """A running cluster whose actors the job shares (its ``cluster`` folder's state)."""

    def __init__(self, run_dir: Path) -> None:
        folder = run_dir / "cluster" if (run_dir / "cluster" / "state.json").is_file() else run_dir
        self.state_dir = folder
        self.state = local.read_state(folder)
        svc = self.state.get("services", {})
        if not svc:
            raise ProcessError(f"--fleet {run_dir}: no running cluster there (no state.json)")
        if "llmproxy" not in svc or not pid_alive(svc["llmproxy"]["pid"]):
            raise ProcessError(f"--fleet {run_dir}: its LLMProxy is not running")
        self.actors = {n: s["address"] for n, s in svc.items() if base_name(n) == "actor" and pid_alive(s["pid"])}
        if not self.actors:
            raise ProcessError(f"--fleet {run_dir}: no actor of it is running")
        self.llmproxy = svc["llmproxy"]["address"]
        # The base the actors serve: the joining job trains its adapter on it (not a model of its own).
        first = svc[next(iter(self.actors))]
        self.model = str(first.get("env", {}).get("ROLLART_MODEL", ""))
        self.token = Path(self.state["token_file"]).read_text().strip()
        self.attached: list[str] = []

    def adopt_token(self, state_dir: Path) -> None:
        """The joining job's cluster uses the fleet's bearer token (its own segment key stays its own)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        target = state_dir / "job-token"
        shutil.copyfile(self.state["token_file"], target)
        target.chmod(0o600)

    def service_env(self, job_id: str) -> dict[str, dict[str, str]]:
        """Environment of the joining job's services: the fleet's LLMProxy, named by the job."""
        peer = {"ROLLART_LLMPROXY": self.llmproxy, "ROLLART_LLMPROXY_JOB_ID": job_id}
        return {"trainer": dict(peer), "envmanager": dict(peer)}

    async def attach(self, spec: trainer_pb2.TrainerJobSpec, key: bytes, state: dict[str, Any]) -> None:
        """AttachJob on every fleet actor; raises ProcessError naming the actor that refused."""
        svc = state["services"]
        req = actor_pb2.AttachJobRequest(
            job_id=spec.job_id,
            job_key=key,
            rank=spec.lora.rank,
            alpha=spec.lora.alpha,
            target_modules=list(spec.lora.target_modules),
            ledger=svc["ledger"]["address"],
        )
        req.weight_source.relay_endpoint = svc["relay"]["address"]
        req.weight_source.fallback_endpoints.append(svc["trainer"]["address"])
        req.weight_source.checkpoint_store = spec.publish.checkpoint_store
        for name, address in self.actors.items():
            ch = channel(address, token=self.token, default_timeout=120.0)
            try:
                await actor_pb2_grpc.ActorStub(ch).AttachJob(req)
            except aio.AioRpcError as exc:
                raise ProcessError(f"fleet actor {name} refused job {spec.job_id}: {exc.details()}") from None
            finally:
                await ch.close()
            self.attached.append(name)

    async def wait_loaded(self, job_id: str, timeout: float = 180.0) -> None:
        """Until every attached actor serves the job's first adapter version (else ProcessError with its error)."""
        deadline = time.monotonic() + timeout
        waiting = list(self.attached)
        last = ""
        while waiting:
            name = waiting[0]
            ch = channel(self.actors[name], token=self.token, default_timeout=10.0)
            try:
                st = await actor_pb2_grpc.ActorStub(ch).GetStatus(actor_pb2.ActorStatusRequest())
                if st.job_weights[job_id].loaded:
                    waiting.pop(0)
                    continue
                last = st.last_update_error
            except aio.AioRpcError as exc:
                last = exc.details() or exc.code().name
            finally:
                await ch.close()
            if time.monotonic() > deadline:
                raise ProcessError(f"fleet actor {name} has not loaded job {job_id}'s adapter: {last or 'no error'}")
            await asyncio.sleep(0.5)

    async def detach(self, job_id: str) -> None:
        """DetachJob on every actor it was attached to (an actor gone meanwhile is skipped)."""
        for name in self.attached:
            ch = channel(self.actors[name], token=self.token, default_timeout=30.0)
            try:
                await actor_pb2_grpc.ActorStub(ch).DetachJob(actor_pb2.DetachJobRequest(job_id=job_id))
            except aio.AioRpcError:
                pass
            finally:
                await ch.close()
        self.attached = []
