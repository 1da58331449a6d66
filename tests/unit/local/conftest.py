"""Shared setup of the local-cluster tests: the plan of an emulated links process (docs/regions.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def links_plan(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """Builds a links plan in ``tmp_path``: directions a->b (down) and b->a (up), one forwarder per name to
    ``target``, all listening on ``listen``."""

    def plan(
        target: str,
        links: dict[str, dict[str, float]] | None = None,
        *,
        names: tuple[str, ...] = ("b>x",),
        listen: str = "127.0.2.2:0",
        ready_file: Path | None = None,
    ) -> dict[str, Any]:
        return {
            "links": links or {"a->b": {"rate_mbps": 8}, "b->a": {"rate_mbps": 8}},
            "forwarders": [
                {"name": name, "listen": listen, "target": target, "up": "b->a", "down": "a->b"} for name in names
            ],
            "ready_file": str(ready_file or tmp_path / "ready"),
            "counters_file": str(tmp_path / "links.json"),
        }

    return plan


@pytest.fixture
def links_plan_file(tmp_path: Path, links_plan: Callable[..., dict[str, Any]]) -> str:
    """A plan written where restart_links and the supervisor read it (one forwarder on a free port, to a closed
    one); returns the forwarder's address."""
    from rollart.local.processes import free_port

    listen = f"127.0.2.2:{free_port('127.0.2.2')}"
    plan = links_plan("127.0.1.1:9", listen=listen, ready_file=tmp_path / "run" / "links.ready")
    (tmp_path / "links-plan.json").write_text(json.dumps(plan))
    return listen
