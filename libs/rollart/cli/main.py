"""The ``rollart`` command line.

rollart up [--only SERVICE ...]     start a local cluster (private redis + services) as processes
rollart up --with-prometheus        ... and Prometheus scraping every service (docs/tracking.md)
rollart status [--json]             health of every service of the local cluster
rollart down                        stop it, leaving no process behind
rollart health --address HOST:PORT  exit 0 iff the gRPC health service answers SERVING (container probes)
                                    (health, status, resources, ledger: TLS from --tls-* flags, ROLLART_TLS__*
                                    or the tls section of --config / ROLLART_CONFIG, as the services read it)
rollart resources pools|workers|bindings [--json]
rollart ledger status [--json]      versions, actors, leases and sample buffer of the job ledger
rollart run JOB.yaml                train a job on a local cluster (progress bar, metrics, reward curve)
rollart samples RUN_DIR             a run's sampled trajectories (prompt, turns, reward, version), readable
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollart.cli import tls as cli_tls
from rollart.local import cluster as local
from rollart.local.processes import ProcessError, pid_alive
from rollart.runtime.auth import bearer
from rollart.runtime.config import ConfigError, TLSConfig

# Subcommands contributed by other parts: module path -> attribute that registers them on the subparsers.
# Modules that are missing (a service that is not installed) are skipped; the command then explains.
PLUGINS = [
    ("rollart.delta.cli", "add_subparsers"),
    ("rollart.cli.ledger", "add_subparsers"),
    ("rollart.job.run", "add_subparsers"),
    ("rollart.cli.samples", "add_subparsers"),
]


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir).resolve() if args.state_dir else local.default_state_dir()


def health_status(address: str, service: str = "", timeout: float = 3.0, tls: TLSConfig | None = None) -> str:
    try:
        with cli_tls.sync_channel(address, tls) as ch:
            # types-grpcio-health-checking declares HealthStub without its methods.
            stub = health_pb2_grpc.HealthStub(ch)
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)  # type: ignore[attr-defined]
            return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError as exc:
        return f"UNREACHABLE ({exc.code().name})"


def cmd_up(args: argparse.Namespace) -> int:
    try:
        local.up(_state_dir(args), args.only or None)
    except ProcessError as exc:
        print(f"rollart up: {exc}", file=sys.stderr)
        return 1
    print(f"cluster state: {_state_dir(args) / 'state.json'}   (stop with `rollart down`)")
    if args.with_prometheus:  # scrapes every service of the cluster (docs/tracking.md)
        from rollart.job import monitoring

        try:
            prom = monitoring.start(_state_dir(args))
        except ProcessError as exc:
            print(f"rollart up: prometheus: {exc}", file=sys.stderr)
            return 1
        print(f"prometheus: {prom['url']}   (config {prom['config']})")
    if args.supervise:
        from rollart.local.supervisor import supervise

        print("supervising: a process that dies is started again (Ctrl-C stops supervising, not the cluster)")
        try:
            supervise(_state_dir(args))
        except KeyboardInterrupt:
            pass
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from rollart.job import monitoring

    prometheus_gone = monitoring.stop(_state_dir(args))  # `up --with-prometheus`: none otherwise
    return 0 if local.down(_state_dir(args)) and prometheus_gone else 1


def cmd_status(args: argparse.Namespace) -> int:
    state = local.read_state(_state_dir(args))
    if not state:
        print(f"no local cluster in {_state_dir(args)} (start one with `rollart up`)", file=sys.stderr)
        return 1
    tls = _tls_or_exit("rollart status", args)
    rows = []
    for name, info in state.get("services", {}).items():
        status = health_status(info["address"], tls=tls) if pid_alive(info["pid"]) else "DEAD"
        rows.append({"service": name, "address": info["address"], "pid": info["pid"], "status": status})
    if state.get("mooncake"):
        mc = state["mooncake"]
        rows.insert(
            0,
            {
                "service": "mooncake",
                "address": mc.get("address", ""),
                "pid": mc.get("pid"),
                "status": "RUNNING" if pid_alive(mc["pid"]) else "DEAD",
            },
        )
    redis_alive = pid_alive(state["redis"]["pid"]) if state.get("redis") else False
    rows.insert(
        0,
        {
            "service": "redis",
            "address": state.get("redis", {}).get("url", ""),
            "pid": state.get("redis", {}).get("pid"),
            "status": "RUNNING" if redis_alive else "DEAD",
        },
    )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'SERVICE':<18}{'STATUS':<24}{'PID':<9}ADDRESS")
        for r in rows:
            print(f"{r['service']:<18}{r['status']:<24}{r['pid']!s:<9}{r['address']}")
    healthy = all(r["status"] in ("SERVING", "RUNNING") for r in rows)
    return 0 if healthy else 1


def _tls_or_exit(prog: str, args: argparse.Namespace) -> TLSConfig | None:
    try:
        return cli_tls.from_args(args)
    except ConfigError as exc:  # one line naming the key, e.g. a certificate file that is not there
        raise SystemExit(f"{prog}: {' '.join(str(exc).split())}") from None


def cmd_health(args: argparse.Namespace) -> int:
    status = health_status(args.address, args.service, args.timeout, _tls_or_exit("rollart health", args))
    print(status)
    return 0 if status == "SERVING" else 1


def _rm_target(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.address:
        token = None
        if args.token_file:
            token = Path(args.token_file).read_text().strip()
        token = token or os.environ.get("ROLLART_JOB_TOKEN")
        return args.address, token
    state = local.read_state(_state_dir(args))
    info = state.get("services", {}).get("resource-manager")
    if not info:
        raise SystemExit("rollart: no resource manager in the local cluster; pass --address (and --token-file)")
    return info["address"], Path(state["token_file"]).read_text().strip()


def cmd_resources(args: argparse.Namespace) -> int:
    from rollart.v1 import resource_manager_pb2 as rm
    from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

    address, token = _rm_target(args)
    metadata = [bearer(token)] if token else []
    with cli_tls.sync_channel(address, _tls_or_exit("rollart resources", args)) as ch:
        stub = rm_grpc.ResourceManagerStub(ch)
        try:
            if args.what == "pools":
                items = stub.ListPools(rm.ListPoolsRequest(), metadata=metadata, timeout=10).pools
            elif args.what == "workers":
                items = stub.ListWorkers(
                    rm.ListWorkersRequest(include_expired=args.all), metadata=metadata, timeout=10
                ).workers
            else:
                items = stub.ListBindings(rm.ListBindingsRequest(), metadata=metadata, timeout=10).bindings
        except grpc.RpcError as exc:
            print(f"rollart resources: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    dicts = [MessageToDict(i, preserving_proto_field_name=True) for i in items]
    if args.json:
        print(json.dumps(dicts, indent=2))
        return 0
    _print_table(args.what, dicts)
    return 0


def _print_table(what: str, rows: list[dict[str, Any]]) -> None:
    if what == "pools":
        cols = ["name", "kind", "capacity", "bound_slots", "live_workers", "up", "region"]
    elif what == "workers":
        cols = ["worker_id", "role", "pool", "endpoint", "state", "region"]
    else:
        cols = ["binding_id", "role", "replicas", "workers", "fallback", "degraded", "reason"]
    table = []
    for r in rows:
        row = []
        for c in cols:
            v = r.get(c, "")
            if c == "workers":
                v = ",".join(f"{w['worker_id']}@{w.get('pool', '')}" for w in v)
            row.append(str(v).replace("POOL_KIND_", "").replace("WORKER_STATE_", ""))
        table.append(row)
    widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for line in table:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)))
    if not table:
        print(f"(no {what})")


# Commands defined here: running one of them skips importing the plugins (a container health check runs
# `rollart health` every few seconds, and the plugins pull in numpy and matplotlib).
BUILTIN = {"up", "down", "status", "health", "resources"}


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollart", description="RollArt: agentic RL across scattered hardware")
    parser.add_argument("--state-dir", help="local cluster state folder (default .rollart or ROLLART_STATE_DIR)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start a local cluster as processes")
    p.add_argument("--only", nargs="+", metavar="SERVICE", choices=local.SERVICE_NAMES, help="start only these")
    p.add_argument("--supervise", action="store_true", help="stay in the foreground and restart any process that dies")
    p.add_argument("--with-prometheus", action="store_true", help="also start Prometheus scraping every service")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("down", help="stop the local cluster")
    p.set_defaults(func=cmd_down)
    p = sub.add_parser("status", help="health of every service of the local cluster")
    p.add_argument("--json", action="store_true")
    cli_tls.add_arguments(p)
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("health", help="exit 0 iff a gRPC server reports SERVING")
    p.add_argument("--address", required=True)
    p.add_argument("--service", default="", help="service name to check (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0)
    cli_tls.add_arguments(p)
    p.set_defaults(func=cmd_health)
    p = sub.add_parser("resources", help="pools, workers and bindings of the resource manager")
    p.add_argument("what", choices=["pools", "workers", "bindings"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help="workers: include expired ones")
    p.add_argument("--address", help="resource manager address (default: the local cluster's)")
    p.add_argument("--token-file", help="job token file (default: the local cluster's, or ROLLART_JOB_TOKEN)")
    cli_tls.add_arguments(p)
    p.set_defaults(func=cmd_resources)

    for module, attr in PLUGINS if plugins else ():
        try:
            getattr(importlib.import_module(module), attr)(sub)
        except ImportError:
            continue
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    builtin = bool(argv) and argv[0] in BUILTIN
    args = build_parser(plugins=not builtin).parse_args(argv)
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
