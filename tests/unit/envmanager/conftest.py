"""Shared setup of the envmanager's unit tests: a Manager whose ledger and reward stubs are in-process fakes."""

from __future__ import annotations

from typing import Any

from rollart.v1 import envmanager_pb2
from rollart_envmanager.config import EnvManagerConfig
from rollart_envmanager.loop import Group
from rollart_envmanager.manager import Manager


def fake_manager(ledger: Any, reward: Any, **cfg: Any) -> Manager:
    """Manager "em-1" (no auth, nothing dialled) whose ledger and reward stubs are ``ledger`` and ``reward``."""
    m = Manager(
        EnvManagerConfig(
            manager_id="em-1", ledger="127.0.0.1:9", reward="127.0.0.1:9", insecure_disable_auth=True, **cfg
        )
    )

    async def ledger_stub() -> Any:
        return ledger

    async def reward_stub() -> Any:
        return reward

    m._ledger = ledger_stub  # type: ignore[method-assign]
    m.peers.reward.stub = reward_stub  # type: ignore[method-assign]
    return m


def builtin_group(m: Manager, scorers: list[str]) -> Group:
    """Group "em-1/g" of one loop on the builtin code environment."""
    request = envmanager_pb2.StartLoopsRequest(
        group_id="g", count=1, env=envmanager_pb2.EnvironmentSpec(environment="code:builtin")
    )
    return Group(request, m.task_config(request.env), "em-1/g", scorers)
