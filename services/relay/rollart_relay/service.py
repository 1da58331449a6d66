"""The relay service: a DeltaHub (buffers, disk cache, striped-transport endpoint, subscribers, events,
commits) behind the rollart.v1.Relay gRPC API, plus the upstream follower when fed by another relay.

Upstream kinds: ``trainer`` (the trainer pushes every version to this relay's data endpoint; nothing to
dial) or ``relay`` (this relay subscribes to an upstream relay like an actor would, pulls each version
cut-through into its own buffers, and re-emits the Commit orders to its subscribers; on failure it moves
to the configured fallbacks, e.g. a peer relay or the trainer).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from grpc import aio

from rollart.runtime.timeutil import timestamp
from rollart.v1 import relay_pb2
from rollart.weights import relay_api
from rollart.weights.follower import SourceFollower
from rollart.weights.hub import DeltaHub, VersionBuffer
from rollart.weights.relay_api import RelayServicer

from .config import RelayConfig

log = logging.getLogger(__name__)

_KINDS = {"trainer": relay_pb2.UPSTREAM_KIND_TRAINER, "relay": relay_pb2.UPSTREAM_KIND_RELAY}


class RelayService:
    name = "relay"
    service_names = [relay_api.SERVICE_NAME]

    def __init__(self, cfg: RelayConfig) -> None:
        self.cfg = cfg
        self.relay_id = cfg.relay_id or cfg.instance_name or f"relay-{os.getpid()}"
        self._tmp_cache: Path | None = None
        cache_dir = cfg.cache_dir
        if cache_dir is None:
            self._tmp_cache = cache_dir = Path(tempfile.mkdtemp(prefix="rollart-relay-"))
        key = cfg.key()
        assert key is not None  # the config validator guarantees it
        self.hub = DeltaHub(
            job=cfg.job_id,
            key=key,
            relay_id=self.relay_id,
            region=cfg.region,
            cache_dir=cache_dir,
            capacity_bytes=cfg.cache_capacity_bytes,
            max_versions=cfg.cache_max_versions,
            memory_versions=cfg.memory_versions,
            store_and_forward=cfg.forward_mode == "store_and_forward",
            streams=cfg.streams,
            reconnect_timeout=cfg.reconnect_timeout_seconds,
            idle_timeout=cfg.idle_timeout_seconds,
            pull_wait=cfg.pull_wait_seconds,
            subscriber_ttl=cfg.subscriber_ttl_seconds,
            alternatives=cfg.alternatives,
        )
        self.hub.refresh_upstream = self._refresh_upstream
        self.servicer = RelayServicer(self.hub, set_upstream=self.set_upstream)
        self.follower: SourceFollower | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        relay_api.add_to_server(self.servicer, server)

    async def start(self) -> None:
        await self.hub.start(self.cfg.data_listen, self.cfg.data_advertise)
        up = self.cfg.upstream
        await self.set_upstream(
            relay_pb2.RelayUpstream(
                kind=_KINDS[up.kind], endpoint=up.endpoint or "", fallbacks=up.fallbacks, streams=up.streams
            )
        )
        log.info("relay %s: data endpoint %s, job %s", self.relay_id, self.hub.data_endpoint, self.cfg.job_id)

    async def on_draining(self) -> None:
        """SIGTERM: subscribers are told to move now, so the gRPC server's drain does not wait on watches."""
        await self.hub.drain(f"relay {self.relay_id} is shutting down")

    async def stop(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        await self.hub.stop(reason=f"relay {self.relay_id} is shutting down")
        if self._tmp_cache is not None:
            shutil.rmtree(self._tmp_cache, ignore_errors=True)

    def ready_info(self) -> dict[str, str]:
        """Extra fields of the ready file (read by `rollart up` and tests)."""
        return {"data_endpoint": self.hub.data_endpoint, "relay_id": self.relay_id, "job_id": self.cfg.job_id}

    # ------------------------------------------------------------------------------------------- upstream

    async def set_upstream(self, up: relay_pb2.RelayUpstream) -> relay_pb2.RelayUpstreamStatus:
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None
        self.hub.upstream.config.CopyFrom(up)
        self.hub.upstream.active_endpoint = "trainer" if up.kind == relay_pb2.UPSTREAM_KIND_TRAINER else ""
        if up.kind == relay_pb2.UPSTREAM_KIND_RELAY:
            self.follower = SourceFollower(
                subscriber_id=self.relay_id,
                kind=relay_pb2.RELAY_SUBSCRIBER_KIND_RELAY,
                job=self.cfg.job_id,
                key=self.hub.key,
                token=self.cfg.token(),
                endpoints=[up.endpoint, *up.fallbacks],
                sink_for=self._sink_for,
                state=self._state,
                on_commit=self._on_commit,
                streams=up.streams or self.cfg.streams,
                region=self.cfg.region,
                tls=self.cfg.tls,
                reconnect_timeout=min(3.0, self.cfg.reconnect_timeout_seconds),
                idle_timeout=self.cfg.idle_timeout_seconds,
            )
            self.follower.start()
        self._refresh_upstream()
        return self.hub.upstream

    def _sink_for(self, version: int) -> VersionBuffer | None:
        buf = self.hub.buffer(version, source=self.follower.active_endpoint if self.follower else "relay")
        return None if buf.complete else buf

    def _state(self) -> tuple[bool, int, list[int]]:
        done = self.hub.complete_versions()
        return bool(done), (done[-1] if done else 0), done

    async def _on_commit(self, order) -> None:
        self.hub.commit(order)  # re-emitted to this relay's subscribers (idempotent per order_id)

    def _refresh_upstream(self) -> None:
        st = self.hub.upstream
        st.bytes_received = self.hub.bytes_received
        if self.hub.last_segment_at is not None:
            st.last_segment_at.CopyFrom(timestamp(self.hub.last_segment_at))
        f = self.follower
        if f is not None:
            st.active_endpoint = f.active_endpoint
            st.connected = f.connected
            st.failovers = f.failovers
            st.last_error = f.last_error
        else:
            st.connected = self.hub.receiving_sessions() > 0 or (
                self.hub.last_segment_at is not None and time.time() - self.hub.last_segment_at < 60
            )
