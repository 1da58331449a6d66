"""The relay's cross-region egress in a real job (issue 26: 1/N of direct with N actors in the region), rows of
``python -m bench geo``: ``relay-nN`` and ``direct-nN`` (N actors, 1 to ``MAX_FANOUT``).

- ``relay-nN``: examples/geo.yaml with ``cluster.actors: N`` and ``actor`` .. ``actor-N`` placed by name in the
  actors' region beside the relay: the trainer pushes each delta once across the link, the relay fans it out.
- ``direct-nN``: the same actors, the relay moved to the trainer's region, and the actors' relay endpoint
  (``ROLLART_WEIGHT_SOURCE__RELAY_ENDPOINT``) a closed port of their own region: each actor's first source refuses,
  so it follows its next one, the trainer (``ROLLART_WEIGHT_SOURCE__FALLBACK_ENDPOINTS``, through its region's
  forwarder; the trainer advertises its data endpoint as that forwarder), and pulls its own copy of each delta
  across the link. The relay stays up (``rollart run`` needs one) with no subscriber; the trainer's pushes to it
  are loopback. No service change: the launcher has no "no relay" switch, and a relay in the trainer's region
  followed by the actors would hand them its real data address, which the links do not route (docs/regions.md).

Each row's weights egress is what crossed out of the trainer's region through the data forwarders (the
striped-transport listeners: the relay's in relay rows, the trainer's in direct rows) and the checkpoint file
server, from the links process's counters, per version published and per delta byte (copies of each delta that
crossed: about 1 through the relay, N direct). ``relay_egress_ratio`` on ``relay-nN`` = its copies over
``direct-nN``'s at the same rate (target 1/N).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollart.local.regions import Regions

FANOUT = re.compile(r"^(relay|direct)-n(\d{1,2})$")
MAX_FANOUT = 8
ACTOR = re.compile(r"^actor(-\d+)?$")
CLOSED_PORT = 1  # a privileged port nothing of the job listens on: the actor's Subscribe to it is refused at once
RELAY_ENDPOINT_ENV = "ROLLART_WEIGHT_SOURCE__RELAY_ENDPOINT"


def parse(config: str) -> tuple[str, int] | None:
    """``(kind, N)`` of a fan-out row (``relay`` or ``direct``), None for any other config; ValueError for a bad N."""
    m = FANOUT.match(config)
    if not m:
        return None
    n = int(m.group(2))
    if not 1 <= n <= MAX_FANOUT:
        raise ValueError(f"{config}: N from 1 to {MAX_FANOUT} actors")
    return m.group(1), n


def region_holding(place: dict[str, list[str]], wanted: str) -> str | None:
    """The region whose list names ``wanted`` (for ``actor``: any actor instance)."""
    for region, names in place.items():
        if any(n == wanted or (wanted == "actor" and ACTOR.match(n)) for n in names):
            return region
    return None


def fanout_sets(kind: str, n: int, place: dict[str, list[str]]) -> list[str]:
    """The job file's overrides of a ``relay-nN`` / ``direct-nN`` row from its ``cluster.regions.place``."""
    trainer, actors = region_holding(place, "trainer"), region_holding(place, "actor")
    if trainer is None or actors is None or trainer == actors:
        raise ValueError("the fan-out rows need the trainer and the actors in two regions (cluster.regions.place)")
    new = {r: [x for x in names if not ACTOR.match(x)] for r, names in place.items()}
    at = next(i for i, x in enumerate(place[actors]) if ACTOR.match(x))  # the actors where the file lists them
    new[actors][at:at] = ["actor"] + [f"actor-{i}" for i in range(2, n + 1)]
    if kind == "direct":
        for names in new.values():
            if "relay" in names:
                names.remove("relay")
        new[trainer].append("relay")
    sets = [f"cluster.actors={n}"] + [f"cluster.regions.place.{r}={json.dumps(v)}" for r, v in new.items()]
    if kind == "direct":
        closed = f"{Regions(new).host(actors)}:{CLOSED_PORT}"
        sets.append(f"cluster.env.actor.{RELAY_ENDPOINT_ENV}={json.dumps(closed)}")
    return sets


def weights_egress(links: dict[str, Any], source: str) -> dict[str, int]:
    """Bytes out of region ``source`` (the trainer's) through the weight forwarders of the links process's counters
    (``links.json``): ``data`` (striped transport: deltas), ``checkpoints`` (full weights over HTTP)."""
    out = {"data": 0, "checkpoints": 0}
    for name, f in (links.get("forwarders") or {}).items():
        kind = "data" if name.endswith("/data") else "checkpoints" if name.endswith(">checkpoints") else None
        if kind is None:
            continue
        if str(f.get("up_link", "")).startswith(f"{source}->"):  # the caller is in the trainer's region: pushes
            out[kind] += int(f.get("bytes_up", 0))
        if str(f.get("down_link", "")).startswith(f"{source}->"):  # the callee is: pulls and GETs
            out[kind] += int(f.get("bytes_down", 0))
    return out


def egress_fields(links: dict[str, Any], source: str | None, deltas: list[int]) -> dict[str, Any]:
    """A row's weights egress: bytes, per version published, per delta byte (copies that crossed)."""
    if not source:
        return {}
    parts = weights_egress(links, source)
    total = parts["data"] + parts["checkpoints"]
    row: dict[str, Any] = {"weights_egress_bytes": total, "weights_egress_parts": parts}
    if deltas:
        row["weights_egress_per_version"] = total / len(deltas)
        if sum(deltas):
            row["weights_egress_per_delta"] = total / sum(deltas)
    return row


def add_egress_ratios(rows: list[dict[str, Any]]) -> None:
    """``relay_egress_ratio`` (copies per delta through the relay over direct's, same N and rate) and
    ``egress_target`` (1/N) on each ``relay-nN`` row with its ``direct-nN``."""
    by = {(r["config"], r.get("link_mbps")): r for r in rows if not r.get("faults")}
    for r in rows:
        spec = parse(r["config"]) if FANOUT.match(r["config"]) else None
        if not spec or spec[0] != "relay":
            continue
        direct = by.get((f"direct-n{spec[1]}", r.get("link_mbps")))
        mine, theirs = r.get("weights_egress_per_delta"), (direct or {}).get("weights_egress_per_delta")
        if mine is not None and theirs:
            r["relay_egress_ratio"] = mine / theirs
            r["egress_target"] = 1 / spec[1]
