"""``rollart ledger status [--json]``: the job at a glance, from the Job Ledger.

The ledger is the local cluster's (``rollart up``) unless ``--address`` (and ``--token-file`` or
``ROLLART_JOB_TOKEN``) name another one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from rollart.cli import tls as cli_tls
from rollart.job.metrics import FATES
from rollart.local import cluster as local
from rollart.runtime.auth import bearer


def add_subparsers(sub: Any) -> None:
    p = sub.add_parser("ledger", help="the job ledger: versions, actors, leases, sample buffer")
    lsub = p.add_subparsers(dest="ledger_command", required=True)
    st = lsub.add_parser(
        "status", help="versions, actors with version state and tau, leases by state, buffer"
    )
    st.add_argument("--json", action="store_true", help="print the LedgerStatus message as JSON")
    st.add_argument("--all", action="store_true", help="include dead and departed actors")
    st.add_argument("--versions", type=int, default=10, help="most recent versions to show (default 10)")
    st.add_argument("--address", help="ledger address (default: the local cluster's)")
    st.add_argument(
        "--token-file", help="job token file (default: the local cluster's, or ROLLART_JOB_TOKEN)"
    )
    st.add_argument("--timeout", type=float, default=10.0)
    cli_tls.add_arguments(st)
    st.set_defaults(func=cmd_status)


def _target(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.address:
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        return args.address, token or os.environ.get("ROLLART_JOB_TOKEN")
    state_dir = (
        Path(args.state_dir).resolve() if getattr(args, "state_dir", None) else local.default_state_dir()
    )
    state = local.read_state(state_dir)
    info = state.get("services", {}).get("ledger")
    if not info:
        raise SystemExit(
            f"rollart ledger: no ledger in the local cluster ({state_dir}); start one with "
            "`rollart up --only resource-manager ledger`, or pass --address (and --token-file)"
        )
    token = (
        Path(args.token_file).read_text().strip()
        if args.token_file
        else Path(state["token_file"]).read_text().strip()
    )
    return info["address"], token


def cmd_status(args: argparse.Namespace) -> int:
    from rollart.v1 import ledger_pb2 as lp
    from rollart.v1 import ledger_pb2_grpc as lg

    address, token = _target(args)
    metadata = [bearer(token)] if token else []
    with cli_tls.channel_or_exit("rollart ledger status", args, address) as ch:
        try:
            status = lg.LedgerStub(ch).GetStatus(
                lp.LedgerStatusRequest(
                    versions_limit=max(args.versions, 0), include_inactive_actors=args.all
                ),
                metadata=metadata,
                timeout=args.timeout,
            )
        except grpc.RpcError as exc:
            print(f"rollart ledger status: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(MessageToDict(status, preserving_proto_field_name=True), indent=2))
        return 0
    print(render(status))
    return 0


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    out = ["  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    out += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return out


def _secs(d: Any) -> str:
    return f"{d.seconds + d.nanos / 1e9:.3g}s"


def render(st: Any) -> str:
    """The human-readable status table."""
    from rollart.v1 import common_pb2
    from rollart.v1 import ledger_pb2 as lp

    p = st.policy
    admission = common_pb2.AdmissionPolicy.Name(p.admission).removeprefix("ADMISSION_POLICY_")
    lines = [
        f"job {p.job_id or '(unset)'}   admission {admission}  alpha {p.alpha}  G {p.group_size}  "
        f"redundancy {p.redundancy}",
        f"step {st.current_step}   current version n {st.current_version}   "
        f"latest version {st.latest_version}   "
        f"lease ttl {_secs(st.lease_ttl)} (median completion {_secs(st.median_completion_time)})",
        "",
        "VERSIONS",
    ]
    vrows = [
        [str(v.version), str(v.base_version), v.hash.hex()[:12], str(v.delta_bytes), str(v.delta_entries),
         "yes" if v.checkpoint_uri else ""]
        for v in st.versions
    ]  # fmt: skip
    lines += (
        _table(["V", "BASE", "HASH", "DELTA_BYTES", "ENTRIES", "CHECKPOINT"], vrows)
        if vrows
        else ["  (none)"]
    )
    lines += ["", "ACTORS"]
    arows = []
    for a in st.actors:
        w = a.weights
        staged = ",".join(f"{s.version}{'' if s.complete else '…'}" for s in w.staged) or "-"
        arows.append(
            [
                a.actor_id,
                lp.ActorLiveness.Name(a.liveness).removeprefix("ACTOR_LIVENESS_"),
                str(w.active_version) if w.loaded else "-",
                staged,
                f"{a.tau:.0f}",
                str(a.in_flight_requests),
                str(a.settled_tokens),
                str(a.excluded_steps),
                a.region,
                a.relay_id,
            ]
        )
    cols = [
        "ACTOR",
        "LIVENESS",
        "ACTIVE",
        "STAGED",
        "TAU",
        "IN_FLIGHT",
        "TOKENS",
        "EXCLUDED",
        "REGION",
        "RELAY",
    ]
    lines += _table(cols, arows) if arows else ["  (none)"]
    c = st.leases
    lines += [
        "",
        f"LEASES   pending {c.pending}  active {c.active}  settled {c.settled}  rejected {c.rejected}  "
        f"expired {c.expired}  cancelled {c.cancelled}  released {c.released}   open groups {st.open_groups}",
    ]
    b = st.buffer
    lines.append(
        f"BUFFER   {b.samples}/{b.capacity} samples  scored {b.scored_samples}  "
        f"ready {b.ready_groups} groups "
        f"({b.ready_samples} samples)  reserved {b.reserved_samples}  evicted {b.evicted_total}  "
        f"oldest version {b.oldest_version}"
    )
    if st.task_pools:  # multi-task jobs: one pool per task tag
        trows = [
            [t.task, f"{t.share:.0%}" if t.share else "-", str(t.pending_slots), str(t.ready_groups),
             str(t.inflight_samples)]
            for t in st.task_pools
        ]  # fmt: skip
        lines += ["", "TASK POOLS", *_table(["TASK", "SHARE", "PENDING", "READY_GROUPS", "IN_FLIGHT"], trows), ""]
    s = st.settlement
    rejected = ", ".join(
        f"{k.removeprefix('REJECTION_REASON_').lower()} {v}" for k, v in sorted(s.rejected.items())
    )
    lines.append(f"SETTLED  admitted {s.admitted}  duplicates {s.duplicates}  rejected: {rejected or 'none'}")
    a = st.accounting
    fates = FATES
    generated = sum(getattr(a, f).tokens for f in fates)
    lines.append(
        "GENERATED  "
        + "  ".join(f"{f} {getattr(a, f).samples} ({getattr(a, f).tokens} tok)" for f in fates)
        + f"   wasted {a.wasted_token_fraction:.1%} of {generated} tokens"
    )
    return "\n".join(lines)
