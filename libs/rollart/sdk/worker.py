"""The Worker side of the Worker/Cluster programming model.

A ``Worker`` subclass exports methods with a decorator that tells its ``Cluster`` proxy how a call goes out:

- ``@register``: every bound worker runs the call; the Cluster gathers the results in binding order.
- ``@hw_mapping``: the call carries a hardware tag (``tag="decode"``); the Cluster routes it to one worker whose
  hardware tags (or pool name) match, round-robin, falling back to the other bound workers (which the resource
  manager placed on compatible pools) when none matches.
- ``@register_serverless("name")``: the call goes to the serverless endpoint registered under ``name`` instead of
  a worker (an HTTP endpoint that scales on its own; see ``rollart.sdk.serverless``).

Arguments and results travel as JSON, so workers can be called from any language through rollart.v1.ClusterWorker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
DISPATCH_ATTR = "__rollart_dispatch__"
REGISTER, HW_MAPPING, SERVERLESS = "register", "hw_mapping", "register_serverless"


def register(fn: F) -> F:
    setattr(fn, DISPATCH_ATTR, (REGISTER, None))
    return fn


def hw_mapping(fn: F) -> F:
    setattr(fn, DISPATCH_ATTR, (HW_MAPPING, None))
    return fn


def register_serverless(endpoint: str) -> Callable[[F], F]:
    if not endpoint:
        raise ValueError("register_serverless needs the endpoint's registered name")

    def deco(fn: F) -> F:
        setattr(fn, DISPATCH_ATTR, (SERVERLESS, endpoint))
        return fn

    return deco


class Worker:
    """Base class of SDK workers. ``role`` names the worker group in the resource manager."""

    role: str = "worker"

    @classmethod
    def exported_methods(cls) -> dict[str, tuple[str, str | None]]:
        """Method name -> (dispatch mode, serverless endpoint name or None)."""
        out = {}
        for name, member in inspect.getmembers(cls):
            spec = getattr(member, DISPATCH_ATTR, None)
            if spec is not None and not name.startswith("_"):
                out[name] = spec
        return out
