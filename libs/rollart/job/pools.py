"""The actor pools a ``rollart run`` cluster starts, and the tasks a dead pool strands (an affinity without
fallback whose every actor is gone for good)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollart.local import cluster as local
from rollart.v1 import common_pb2

from .spec import JobTask, cluster_actor_pools

if TYPE_CHECKING:
    from .run import RunOptions


def instance_number(name: str) -> int:
    """envmanager -> 1, envmanager-3 -> 3 (local cluster instance names)."""
    head, _, n = name.rpartition("-")
    return int(n) if head and n.isdigit() else 1


def actor_pools(cluster: dict[str, Any], opts: RunOptions) -> set[str]:
    """The actor pools ``rollart run`` starts: each instance's ``ROLLART_POOL`` (``cluster.env.actor-2``, else
    ``cluster.env.actor``, else the actor's default ``cpu``), or the pools of a ``cluster.actors`` list."""
    return {pool for pool, _kind in actor_instance_pools(cluster, opts).values()}


def actor_instance_pools(cluster: dict[str, Any], opts: RunOptions) -> dict[str, tuple[str, str]]:
    """Each actor instance ``rollart run`` starts (``actor``, ``actor-2``, ...) -> (its pool, its kind), as
    :func:`actor_pools` reads them (a pool list's members are numbered in list order)."""
    if isinstance(cluster.get("actors"), list):
        pools = cluster_actor_pools(cluster)
        envs = local.pool_instances("actor", [(p.count, p.env) for p in pools])
        return {name: (env["ROLLART_POOL"], env["ROLLART_POOL_KIND"]) for name, env in envs.items()}
    env = opts.service_env
    base = env.get("actor") or {}
    names = ["actor"] + [f"actor-{i}" for i in range(2, opts.actors + 1)]
    return {
        n: (
            str((env.get(n) or {}).get("ROLLART_POOL", base.get("ROLLART_POOL", "cpu"))),
            str((env.get(n) or {}).get("ROLLART_POOL_KIND", base.get("ROLLART_POOL_KIND", "cpu"))),
        )
        for n in names
    }


def stranded_tasks(
    tasks: list[JobTask], instance_pools: dict[str, tuple[str, str]], dead: set[str]
) -> list[tuple[int, JobTask, str]]:
    """Tasks no actor can ever generate for again: their affinity names a pool (or kind) whose every actor
    instance is dead and not restarted (the supervisor gave up on it), and allows no fallback. Each as
    (index in tasks, task, what is gone). Rules by tags or ``auto`` are not judged here (the proxy still
    answers their turns UNAVAILABLE)."""
    out: list[tuple[int, JobTask, str]] = []
    for i, t in enumerate(tasks):
        rule = t.affinity
        if rule is None or rule.allow_fallback or rule.auto:
            continue
        if rule.pool:
            members = [n for n, (pool, _) in instance_pools.items() if pool == rule.pool]
            what = f"pool {rule.pool!r}"
        elif rule.pool_kind:
            kind = common_pb2.PoolKind.Name(rule.pool_kind).removeprefix("POOL_KIND_").lower().replace("_", "-")
            members = [n for n, (_, k) in instance_pools.items() if k == kind]
            what = f"kind {kind}"
        else:
            continue
        if members and all(n in dead for n in members):
            out.append((i, t, f"every actor of {what} ({', '.join(sorted(members))}) is dead and not restarted"))
    return out
