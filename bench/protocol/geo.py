"""The FrozenLake job with its regions apart (examples/geo.yaml) against the same job in one region and against
full-weight broadcast through the same link: samples/s, step time and weight transfer exposed per step, one row
per mode, with ratios side by side.

Each row is a real `rollart run` of examples/geo.yaml for ``--steps`` steps:

- ``ideal``: ``cluster.regions`` removed (one loopback region, no link);
- ``rollart``: as the file says (sparse deltas through the relay across the emulated link);
- ``full-lag1/2/4``: ``weight_sync: full_checkpoint`` with ``alpha`` 1/2/4: every actor GETs the whole checkpoint
  of each version from the file server in the trainer's region, through the link (docs/regions.md).

``--rate-mbps`` overrides the link's rate both ways (rows then carry ``reference: false``). Medians over steps
3..N: ``step_seconds``; ``samples_per_second`` = batch size / step_seconds; ``transfer_exposed_seconds`` = the
step's update phase (the trainer waits for the actors to stage/load and commit the new version: what the weight
transfer adds to the step); ``generation_seconds``, ``train_seconds``. ``ratio_to_ideal`` = samples/s over the
ideal row's; ``rollart_speedup`` (on full rows) = the rollart row's samples/s over the row's.

The regime (the seed's ratio, issue 26): full weights take ~2.8x a step's generation window (16 GB at 1 Gbit/s =
128 s against 45 s). Here the tiny model's full weights are 1,052,984 bytes (bf16 safetensors) and a step's
generation window on this 2-core machine is ~5 s, so the link runs at 0.6 Mbit/s: 1,052,984 x 8 / 0.6e6 = 14.0 s
= 2.8 x 5 s. Each row also reports what it measured: ``full_bytes``, ``full_transfer_seconds`` (full_bytes at the
link's rate) over the ideal row's ``step_seconds`` (``window_ratio``: async rollout overlaps training, so a
step of the ideal run is the time the actors take to generate one batch), and on every row the per-step
delta density ``delta_bytes_per_step`` / ``full_bytes`` (``delta_density``, from the trainer's "version
published" log lines). The learning rate is examples/geo.yaml's (5e-4, a tiny model on a narrow task): its
updates touch far more bf16 entries than the seed's 1.3% (``--set`` below runs another learning rate).

What the full rows are: each of the region's two actors GETs its own copy (no relay for full weights), so a
version costs the link 2 x 14 s. With alpha > 1 (full-lag2/4) each actor's load of v starts when v is
registered and runs during rollout; UPDATE waits only for actors below v + 1 - alpha, so their
``transfer_exposed_seconds`` is the part of the transfer the lag cannot hide (bench/results/geo-full.json was
measured before this: its lag-2/4 rows loaded inside every UPDATE, as lag 1 does).

Beyond the reference rows (each an option; without them the rows above run as they always did):

- ``--rates LIST`` (``sweep``: 0.15,0.3,0.6,1.2,2.4,6 Mbit/s, 40x): every linked row at each rate (run folder
  ``CONFIG@RATE``); the ideal row once. The sweep's spread is printed: exposed transfer slowest rate / fastest
  (a delta's should stay within 2x, a full row's follow 1/bandwidth: exposed transfer x rate about constant).
- ``rollart-uniform`` / ``rollart-proportional``: the rollart row with ``actor-2`` slowed by its engine
  (``--slow-env``, default ROLLART_MAX_NUM_SEQS=2: at most 2 sequences a batch against the other's 64),
  against the ledger's batch split per actor: uniform (``UNIFORM_SET``) or in proportion to tau, the default.
  Each row carries ``actor_settled_tokens`` (the ledger's, per actor) and their max/min, ``settled_tokens_ratio``
  (proportional: the split follows tau, so about how much slower actor-2 ran), and ``proportional_gain``.
- ``--fault SPEC`` (bench/protocol/geo_faults.py; ``down:30@step3``, ``rate/10:60@step3``): injected into every
  linked row through the links process's control folder; the row carries ``faults`` and is no reference.
- PNGs beside ``--json``: ``-bandwidth.png`` (step time and exposed transfer against the rate, a sweep) and
  ``-timeline.png`` (five consecutive steps per row, as the seed's execution timeline), from each row's
  ``timeline`` (its steps from metrics.jsonl); ``python -m bench geo --plot ROWS.json`` redraws them, and
  ``--into ROWS.json`` merges a run's rows into saved ones (replacing the same config and rate, e.g. a row that
  failed). A row whose job did not complete keeps its ``state`` and is left out of the sweep's spread and curves.
- Full-weight rows below the reference 0.6 Mbit/s give the trainer a longer wait for the actors' loads
  (``commit_wait_seconds`` = 60 s x 0.6 / rate): its 60 s default is too short for two copies at 0.3 Mbit/s.
- ``full-streams``: full-lag1 with each actor GETting a checkpoint as ``--streams`` S (default 4) parallel HTTP
  Range GETs (``ROLLART_CHECKPOINT_STREAMS``, rollart.weights.http_store), the seed's full weights over S TCP
  streams. One TCP flow over a long-RTT link is bound by its window / RTT, so the row caps every connection out
  of the trainer's region (the direction the weights cross) at ``flow_mbps`` = the link's rate / S, each its own
  cap under the shared link: one stream gets 1/S of the link, S streams can fill it. The other direction
  (trajectories, lease calls) stays as full-lag1 has it, so the two rows differ only in how the weights cross.
  full-lag1's one stream has no cap, so full-streams is at best full-lag1 here: the row shows striping taking
  back the link from window-bound flows (one capped stream: S x ``full_transfer_seconds``). The row carries
  ``streams`` and ``flow_mbps``.

- ``relay-nN`` / ``direct-nN`` (N = 1 to 8; bench/protocol/geo_fanout.py): N actors in the actors' region, each
  delta through the relay there (relay) or pulled by every actor from the trainer across the link (direct: the
  relay moved beside the trainer, the actors' relay endpoint a closed port, so they follow their fallback, the
  trainer). Every row with links carries ``weights_egress_bytes`` (out of the trainer's region through the data
  and checkpoint forwarders of ``cluster/links.json``), ``weights_egress_per_version`` and
  ``weights_egress_per_delta`` (copies of each delta that crossed); a relay row with its direct row at the same
  rate ``relay_egress_ratio`` (target 1/N, ``egress_target``).
- ``--set KEY=VALUE`` (``rollart run --set``'s syntax, repeated): a job-file field on every row, after the row's
  own (the ideal row skips ``cluster.regions.*``), checked on every row before anything runs; each row records
  its ``sets``. A ``cluster.*`` or ``model.*`` set makes a row no reference (it may move the link or the
  weights' size). ``delta_density`` is on every row (full-weight modes encode the delta too; None when no
  version was published): e.g. ``--set job.grpo.learning_rate=2.0e-5`` for the seed's ~1.3% per step.

    python -m bench geo --steps 6 --configs ideal,rollart,full-lag1,full-lag4 --json bench/results/geo-smoke.json
    python -m bench geo --steps 6 --configs ideal,rollart,full-lag1,full-streams --streams 4 --json bench/results/geo-streams.json
    python -m bench geo --steps 6 --rates sweep --configs ideal,rollart,full-lag1 --json bench/results/geo-sweep.json
    python -m bench geo --steps 6 --configs relay-n2,direct-n2,relay-n4,direct-n4 --timeout 900 --json bench/results/geo-fanout.json
    python -m bench geo --steps 8 --configs ideal,rollart,full-lag1,full-lag4 --set job.grpo.learning_rate=2.0e-5 \\
        --json bench/results/geo-regime.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.protocol import geo_fanout, geo_plot
from bench.protocol.geo_faults import Fault, Schedule, check_faults, last_step, parse_fault

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "geo.yaml"


def medians(metrics: Path, first: int = 3) -> dict[str, float]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "step_seconds" in r and r.get("kind", "step") == "step"]
    late = [r for r in steps if r["step"] >= first] or steps
    if not late:
        raise RuntimeError(f"no step in {metrics}")
    return {
        "steps": len(steps),
        "step_seconds": statistics.median(r["step_seconds"] for r in late),
        "get_batch_seconds": statistics.median(r.get("get_batch_seconds", 0.0) for r in late),
        "train_seconds": statistics.median(r.get("train_seconds", 0.0) for r in late),
        "transfer_exposed_seconds": statistics.median(r.get("update_seconds", 0.0) for r in late),
    }


def step_timeline(metrics: Path) -> list[dict[str, float]]:
    """Every training step of a run as metrics.jsonl has it: its time and its parts (for the timeline PNG)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [
        {
            "step": r["step"],
            "step_seconds": r["step_seconds"],
            "generation_seconds": r.get("get_batch_seconds", 0.0),
            "train_seconds": r.get("train_seconds", 0.0),
            "transfer_exposed_seconds": r.get("update_seconds", 0.0),
            "finished_at": r.get("finished_at"),
        }
        for r in sorted(rows, key=lambda r: r.get("step", 0))
        if "step_seconds" in r and r.get("kind", "step") == "step"
    ]


CONFIGS = (
    "ideal", "rollart", "full-lag1", "full-lag2", "full-lag4", "full-streams", "rollart-uniform",
    "rollart-proportional", "relay-n2", "direct-n2", "relay-n4", "direct-n4",
)  # fmt: skip
STREAMS = 4  # full-streams: HTTP streams per checkpoint download, and the link's rate / flow cap
MAX_STREAMS = 64  # rollart.weights.http_store's bound on ROLLART_CHECKPOINT_STREAMS
STREAMS_ENV = "ROLLART_CHECKPOINT_STREAMS"
REFERENCE_MBPS, COMMIT_WAIT_S = 0.6, 60.0  # examples/geo.yaml's rate; the trainer's default commit_wait_seconds
SWEEP_RATES = (0.15, 0.3, 0.6, 1.2, 2.4, 6.0)  # Mbit/s each way: 40x around examples/geo.yaml's 0.6
HETERO = ("rollart-uniform", "rollart-proportional")
SLOW_ACTOR = "actor-2"
# An engine with room for 2 sequences at a time against the other actor's 64 (run.py's default): the same
# engine and model, a smaller batch per forward pass, so it decodes the region's trajectories 2-3x slower.
SLOW_ENV = {"ROLLART_MAX_NUM_SEQS": "2"}
# The job option that makes the ledger split each step's batch evenly (JobPolicy.uniform_allocation).
UNIFORM_SET = "job.options.ledger.allocation=uniform"


def check_config(config: str) -> tuple[str, int] | None:
    """ValueError unless ``config`` is a row this runs; its (kind, N) when a fan-out row (relay-nN, direct-nN)."""
    fanout = geo_fanout.parse(config)
    if config not in CONFIGS and fanout is None:
        raise ValueError(f"unknown config {config!r} ({', '.join(CONFIGS)}; relay-nN, direct-nN)")
    return fanout


def config_sets(
    config: str,
    links: dict[str, Any],
    rate_mbps: float | None,
    slow_env: dict[str, str] | None = None,
    streams: int = STREAMS,
    weights_from: str | None = None,
    place: dict[str, list[str]] | None = None,
) -> tuple[list[str], float | None]:
    """The job file's overrides of one row, and its link rate (None: no link). ``weights_from``: the trainer's
    region (full-streams caps the flows of its outgoing links; None: of every link); ``place``: the file's
    ``cluster.regions.place`` (the fan-out rows rewrite it)."""
    fanout = check_config(config)
    if config == "ideal":
        return ["cluster.regions=null"], None
    sets: list[str] = []
    if fanout:
        if place is None:
            raise ValueError(f"{config}: needs the job file's cluster.regions.place")
        sets += geo_fanout.fanout_sets(*fanout, place)
    link_mbps = min(float(v["rate_mbps"]) for v in links.values())
    if rate_mbps:
        sets += [f"cluster.regions.links.{k}.rate_mbps={rate_mbps}" for k in links]
        link_mbps = rate_mbps
    if config.startswith("full-") and link_mbps < REFERENCE_MBPS:
        # The trainer's wait for full-weight loads grows as the link slows (its 60 s default holds at the
        # reference rate, where each actor's copy takes 14 s): at 0.3 Mbit/s two copies took over 60 s.
        wait = math.ceil(COMMIT_WAIT_S * REFERENCE_MBPS / link_mbps)
        sets.append(f"cluster.env.trainer.ROLLART_COMMIT_WAIT_SECONDS={wait}")
    if config.startswith("full-lag"):
        sets += ["job.publish.weight_sync=full_checkpoint", f"job.alpha={int(config.removeprefix('full-lag'))}"]
    if config == "full-streams":
        if not 1 <= streams <= MAX_STREAMS:
            raise ValueError(f"--streams {streams}: from 1 to {MAX_STREAMS}")
        sets += ["job.publish.weight_sync=full_checkpoint", "job.alpha=1"]
        sets.append(f"cluster.env.actor.{STREAMS_ENV}={streams}")  # every actor instance (actor, actor-2)
        for k, v in links.items():  # one flow gets rate / S: S streams can fill the link
            if weights_from is not None and k.split("->")[0].strip() != weights_from:
                continue
            sets.append(f"cluster.regions.links.{k}.flow_mbps={(rate_mbps or float(v['rate_mbps'])) / streams}")
    if config in HETERO:
        env = SLOW_ENV if slow_env is None else slow_env
        sets += [f"cluster.env.{SLOW_ACTOR}.{k}={v}" for k, v in env.items()]
        if config == "rollart-uniform":
            sets.append(UNIFORM_SET)
    return sets, link_mbps


def run_dir(out: Path, config: str, rate_mbps: float | None, sweep: bool, faults: bool) -> Path:
    """A row's run folder: ``CONFIG``, in a sweep ``CONFIG@RATE``, with faults ``+faults`` after it."""
    name = config if not sweep or config == "ideal" else f"{config}@{rate_mbps:g}"
    return out / (name + ("+faults" if faults and config != "ideal" else ""))


def published_delta_bytes(out: Path) -> list[int]:
    """delta_bytes of each version after v0 the trainer published (its JSON log's "version published" lines)."""
    log = out / "cluster" / "logs" / "trainer.log"
    sizes = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if '"version published"' in line:
            try:
                doc = json.loads(line)
                if int(doc.get("version", 1)) > 0:  # v0 is the base: no delta
                    sizes.append(int(doc["delta_bytes"]))
            except (ValueError, KeyError, TypeError):
                continue
    return sizes


def full_bytes(out: Path, model_dir: str | None) -> int | None:
    """Bytes of the full weights: a checkpoint the run committed, else the model's safetensors."""
    for manifest in sorted((out / "cluster" / "weights").glob("v*/manifest.json")):
        return int(json.loads(manifest.read_text())["size"])
    for root in [Path(model_dir)] if model_dir else [out]:
        for f in sorted(root.rglob("model.safetensors")):
            return f.stat().st_size
    return None


def file_rate(job: dict[str, Any]) -> float:
    """The job file's link rate (its slowest direction)."""
    return min(float(v["rate_mbps"]) for v in job["cluster"]["regions"]["links"].values())


def rollart_run(argv: list[str], out: Path, faults: list[Fault]) -> tuple[int, str, list[dict[str, Any]]]:
    """Runs ``rollart run`` to its end, injecting ``faults`` as its steps pass; (exit code, stderr's end,
    the faults injected)."""
    schedule = Schedule(list(faults), out)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            if schedule.pending:
                schedule.poll(last_step(out / "metrics.jsonl"))
            time.sleep(0.5)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-3000:]
    return proc.returncode, tail, schedule.applied


def run_mode(
    config: str,
    out: Path,
    steps: int,
    model_dir: str | None,
    rate_mbps: float | None,
    timeout: float,
    *,
    faults: list[Fault] | None = None,
    slow_env: dict[str, str] | None = None,
    streams: int = STREAMS,
    user_sets: list[str] | None = None,
) -> dict[str, Any]:
    sets = [f"job.max_steps={steps}", "eval.every=0", "eval.at_start=false"]
    if model_dir:
        sets.append(f"model.dir={model_dir}")
    job = yaml.safe_load(JOB.read_text())
    more, link_mbps, applied = row_sets(config, job, rate_mbps, slow_env, streams, user_sets)
    sets += more
    faults = faults if link_mbps is not None else []  # no link, nothing to break
    argv = [str(Path(sys.executable).parent / "rollart"), "run", str(JOB), "--out", str(out), "--quiet"]
    argv += ["--timeout", str(timeout)]
    for s in sets:
        argv += ["--set", s]
    t0 = time.monotonic()
    code, stderr, injected = rollart_run(argv, out, faults or [])
    wall = time.monotonic() - t0
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    metrics = out / "metrics.jsonl"
    if not metrics.exists() or summary.get("steps", 0) < 1:
        raise RuntimeError(f"{config}: rollart run exited {code}:\n{stderr}")
    return build_row(config, job, link_mbps, out, summary, wall, injected, model_dir, slow_env, streams, applied)


def row_sets(
    config: str,
    job: dict[str, Any],
    rate_mbps: float | None,
    slow_env: dict[str, str] | None = None,
    streams: int = STREAMS,
    user_sets: list[str] | None = None,
) -> tuple[list[str], float | None, list[str]]:
    """A row's overrides of the job file (its own, then ``--set``'s), its link rate, and the ``--set`` items it
    got: all of them, but those below ``cluster.regions`` on the ideal row (it has no regions)."""
    regions = job["cluster"]["regions"]
    trainer = geo_fanout.region_holding(regions["place"], "trainer")
    own, link_mbps = config_sets(config, regions["links"], rate_mbps, slow_env, streams, trainer, regions["place"])
    applied = [s for s in user_sets or [] if link_mbps is not None or not s.startswith("cluster.regions")]
    return own + applied, link_mbps, applied


def check_rows(configs: list[str], user_sets: list[str], rate_mbps: float | None = None) -> None:
    """Every row's overrides on the job file pass ``rollart run``'s checks (a SpecError naming the path), before
    anything runs."""
    from rollart.job.spec import apply_overrides, load_job_file
    from rollart.local.cluster import SERVICE_NAMES
    from rollart.local.regions import RegionError, parse_regions

    for config in dict.fromkeys(configs):
        data = load_job_file(JOB)
        sets, _, _ = row_sets(config, data, rate_mbps, user_sets=user_sets)
        data = apply_overrides(data, sets)
        cluster = data.get("cluster") or {}
        try:
            parse_regions(cluster, SERVICE_NAMES, int(cluster.get("actors", 2)))
        except RegionError as exc:
            raise ValueError(f"{config}: {exc}") from None


def build_row(
    config: str,
    job: dict[str, Any],
    link_mbps: float | None,
    out: Path,
    summary: dict[str, Any],
    wall: float,
    faults: list[dict[str, Any]],
    model_dir: str | None = None,
    slow_env: dict[str, str] | None = None,
    streams: int = STREAMS,
    sets: list[str] | None = None,
) -> dict[str, Any]:
    """One row from a finished run's folder (metrics.jsonl, summary.json, the trainer's log). ``sets``: the
    ``--set`` items the row ran with."""
    metrics = out / "metrics.jsonl"
    m = medians(metrics)  # a run stopped by --timeout still gives the steps it made (its state says so)
    batch = int(job["job"]["batch_size"])
    fanout = geo_fanout.parse(config)
    # The ratio's two sides are the link and the weights' size: a --set of cluster.* or model.* may move either.
    moved = any(s.startswith(("cluster.", "model.")) for s in sets or [])
    reference = (link_mbps is None or link_mbps == file_rate(job)) and not faults and config not in HETERO
    reference = reference and not fanout and not moved
    row: dict[str, Any] = {
        "config": config,
        "link_mbps": link_mbps,
        "samples_per_second": batch / m["step_seconds"],
        "step_seconds": m["step_seconds"],
        "transfer_exposed_seconds": m["transfer_exposed_seconds"],
        "generation_seconds": m["get_batch_seconds"],
        "train_seconds": m["train_seconds"],
        "steps": m["steps"],
        "wall_seconds": wall,
        "reward_last10": summary.get("reward_last10"),
        "state": summary.get("state"),
        "reference": reference,  # run at the seed's ratio (examples/geo.yaml's link), nothing else changed
        "timeline": step_timeline(metrics),
    }
    row["sets"] = list(sets or [])
    row.update(settlement_fields(summary))
    if faults:
        row["faults"] = faults
    if fanout:
        row["fanout"], row["actors"] = fanout
    if config == "full-streams" and link_mbps:
        row["streams"], row["flow_mbps"] = streams, link_mbps / streams
    if config in HETERO:
        row["slow_actor"] = {"instance": SLOW_ACTOR, "env": SLOW_ENV if slow_env is None else slow_env}
        row["allocation"] = config.removeprefix("rollart-")
        actors = (summary.get("final") or {}).get("actors") or {}
        row["actor_settled_tokens"] = tokens = {a: int(v.get("settled_tokens", 0)) for a, v in sorted(actors.items())}
        if len(tokens) >= 2 and min(tokens.values()) > 0:  # on the proportional row: about the speed ratio (tau)
            row["settled_tokens_ratio"] = max(tokens.values()) / min(tokens.values())
    size = full_bytes(out, model_dir)
    row["full_bytes"] = size
    if size and link_mbps:
        row["full_transfer_seconds"] = size * 8 / (link_mbps * 1e6)
    deltas = published_delta_bytes(out)  # full-weight modes encode the delta too (its trailer hash is h(v))
    row["delta_bytes_per_step"] = statistics.median(deltas) if deltas else None
    row["delta_density"] = row["delta_bytes_per_step"] / size if deltas and size else None
    links_seen = summary.get("links")
    if links_seen:
        row["link_bytes"] = {k: v["bytes"] for k, v in links_seen["links"].items()}
        row["forwarder_bytes"] = {
            k: {"up": v["bytes_up"], "down": v["bytes_down"]}
            for k, v in links_seen["forwarders"].items()
            if v["bytes_up"] or v["bytes_down"]
        }
        ckpt = [v["bytes_down"] for k, v in links_seen["forwarders"].items() if k.endswith(">checkpoints")]
        if ckpt:
            row["checkpoint_link_bytes"] = sum(ckpt)
        if links_seen.get("faults"):
            row["link_faults"] = links_seen["faults"]  # what the links process applied, and when
        place = (job["cluster"].get("regions") or {}).get("place") or {}
        row.update(geo_fanout.egress_fields(links_seen, geo_fanout.region_holding(place, "trainer"), deltas))
    return row


def settlement_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """What the run's end says about nothing lost: ``settled_once`` (no trajectory settled twice, as
    tests/faults check it), ``submit_retries`` (Submits answered again with their first verdict: replies lost on
    the link) and ``actor_versions`` (each live actor's active version at the end)."""
    final = summary.get("final") or {}
    ledger = final.get("ledger") or {}
    out: dict[str, Any] = {}
    if "settled_slots" in ledger:
        out["settled_once"] = ledger["settled_slots"] == ledger.get("settled_distinct_trajectories")
        out["submit_retries"] = ledger.get("duplicates")
    actors = final.get("actors") or {}
    if actors:
        out["actor_versions"] = {
            a: v.get("active_version") for a, v in sorted(actors.items()) if v.get("liveness") == "ALIVE"
        }
    return out


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """ratio_to_ideal on every row; rollart_speedup (rollart's samples/s over the row's, at the same rate) on the
    full rows; the full transfer over the ideal step, its generation window (window_ratio); proportional_gain
    (samples/s over rollart-uniform's at the same rate) on rollart-proportional. Rows with faults are no base."""
    by = {(r["config"], r.get("link_mbps")): r for r in rows if not r.get("faults")}
    ideal = next((r for (c, _), r in by.items() if c == "ideal"), None)
    for r in rows:
        if ideal:
            r["ratio_to_ideal"] = r["samples_per_second"] / ideal["samples_per_second"]
            if r.get("full_transfer_seconds") and ideal["step_seconds"]:
                r["window_ratio"] = r["full_transfer_seconds"] / ideal["step_seconds"]
        rollart = by.get(("rollart", r.get("link_mbps")))
        if rollart and r["config"].startswith("full"):
            r["rollart_speedup"] = rollart["samples_per_second"] / r["samples_per_second"]
        uniform = by.get(("rollart-uniform", r.get("link_mbps")))
        if uniform and r["config"] == "rollart-proportional":
            r["proportional_gain"] = r["samples_per_second"] / uniform["samples_per_second"]
    geo_fanout.add_egress_ratios(rows)


def merge_rows(saved: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``saved`` with each row of ``new`` in place of the saved row of the same config and rate (else appended)."""
    key = lambda r: (r["config"], r.get("link_mbps"), bool(r.get("faults")))  # noqa: E731
    fresh = {key(r): r for r in new}
    out = [fresh.pop(key(r), r) for r in saved]
    return out + list(fresh.values())


def completed(row: dict[str, Any]) -> bool:
    """A row whose job did not complete (its figures are of the steps before it failed) is left out of the sweep's
    summary and curves; it stays in the JSON with its ``state``."""
    return row.get("state") in (None, "COMPLETED")


def sweep_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode with two rates or more: its rates, exposed transfer at each, that transfer slowest rate over
    fastest (``transfer_spread``; a delta's target: within 2x) and the spread of transfer x rate
    (``bandwidth_product_spread``: near 1 when the transfer follows 1/bandwidth)."""
    out: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r["config"] for r in rows):
        pts = sorted(
            (float(r["link_mbps"]), float(r["transfer_exposed_seconds"])) for r in rows
            if r["config"] == mode and r.get("link_mbps") is not None and not r.get("faults") and completed(r)
        )  # fmt: skip
        if len({x for x, _ in pts}) < 2:
            continue
        slow, fast = pts[0][1], pts[-1][1]
        products = [x * t for x, t in pts]
        out[mode] = {
            "rates": [x for x, _ in pts],
            "transfer_exposed_seconds": [t for _, t in pts],
            "transfer_spread": slow / fast if fast > 0 else None,
            "bandwidth_product_spread": max(products) / min(products) if min(products) > 0 else None,
        }
    return out


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("config", "{}"), ("link_mbps", "{}"), ("samples_per_second", "{:.2f}"), ("step_seconds", "{:.2f}"),
        ("transfer_exposed_seconds", "{:.2f}"), ("generation_seconds", "{:.2f}"), ("train_seconds", "{:.2f}"),
        ("ratio_to_ideal", "{:.3f}"),
        ("rollart_speedup", "{:.2f}"), ("delta_density", "{:.3f}"), ("window_ratio", "{:.2f}"),
        ("proportional_gain", "{:.2f}"), ("weights_egress_per_delta", "{:.2f}"), ("relay_egress_ratio", "{:.3f}"),
    ]  # fmt: skip
    lines = ["  ".join(f"{c:>12}" if c != "config" else f"{c:<20}" for c, _ in cols)]
    for r in rows:
        cells = []
        for c, fmt in cols:
            v = r.get(c)
            text = "-" if v is None else fmt.format(v)
            if c == "config" and r.get("faults"):
                text += " +faults"
            cells.append(f"{text:<20}" if c == "config" else f"{text:>12}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


def parse_rates(text: str) -> list[float]:
    """``--rates``: Mbit/s, comma-separated, or ``sweep`` (SWEEP_RATES)."""
    if text.strip() == "sweep":
        return list(SWEEP_RATES)
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates {text!r}: numbers (Mbit/s), comma-separated, or sweep") from None
    if not rates or any(r <= 0 for r in rates):
        raise ValueError(f"--rates {text!r}: at least one rate, each above 0")
    return sorted(dict.fromkeys(rates))


def parse_env(items: list[str]) -> dict[str, str]:
    """``--slow-env KEY=VALUE`` (repeated) as a mapping."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--slow-env {item!r}: expected KEY=VALUE")
        env[key.strip()] = value
    return env


def plan_rows(configs: list[str], rates: list[float] | None, rate_mbps: float | None) -> list[tuple[str, float | None]]:
    """(config, rate override) of each run in order: without ``rates`` one run per config at ``rate_mbps``;
    with them the ideal row once and every other config at each rate, rate by rate."""
    if not rates:
        return [(c, rate_mbps) for c in configs]
    runs: list[tuple[str, float | None]] = [("ideal", None)] if "ideal" in configs else []
    return runs + [(c, r) for r in rates for c in configs if c != "ideal"]


def write_outputs(rows: list[dict[str, Any]], path: Path, rows_too: bool = True) -> list[Path]:
    """The rows as JSON at ``path`` (unless not ``rows_too``) and the PNGs beside it; the files written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    if rows_too:
        path.write_text(json.dumps(rows, indent=2) + "\n")
        written.append(path)
    stem = path.with_suffix("")
    for name, draw in (("bandwidth", geo_plot.plot_bandwidth), ("timeline", geo_plot.plot_timeline)):
        png = stem.with_name(f"{stem.name}-{name}.png")
        if draw(rows, png):
            written.append(png)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench geo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per run (medians over steps 3..N)")
    ap.add_argument(
        "--configs",
        default="ideal,rollart,full-lag1,full-lag4",
        help=f"rows to run, comma-separated: {', '.join(CONFIGS)} (relay-nN, direct-nN: N actors, 1 to 8)",
    )
    ap.add_argument("--rate-mbps", type=float, help="the link's rate both ways (default: examples/geo.yaml's)")
    ap.add_argument(
        "--rates", help="a bandwidth sweep: every linked row at each rate, Mbit/s comma-separated, or 'sweep' "
        f"({','.join(f'{r:g}' for r in SWEEP_RATES)})"
    )  # fmt: skip
    ap.add_argument(
        "--fault", action="append", default=[], metavar="SPEC",
        help="a link fault in every linked row, e.g. down:30@step3, rate/10:60@step3+2s, train->infer=down:30@step3",
    )  # fmt: skip
    ap.add_argument(
        "--slow-env", action="append", default=[], metavar="KEY=VALUE",
        help=f"the slowed actor's environment in rollart-uniform/-proportional (default: {SLOW_ENV})",
    )  # fmt: skip
    ap.add_argument(
        "--streams", type=int, default=STREAMS,
        help=f"full-streams: HTTP streams per checkpoint; each connection capped at the link's rate / it ({STREAMS})",
    )  # fmt: skip
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
        help="a job-file field for every row, after the row's own (rollart run --set syntax), e.g. "
        "--set job.grpo.learning_rate=2.0e-5; the ideal row skips cluster.regions.*",
    )  # fmt: skip
    ap.add_argument("--model-dir", help="model.dir for every run (a built warm start is reused by recipe)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is stopped")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-geo"), help="run folders (one per config)")
    ap.add_argument("--json", type=Path, help="write the rows here (and the PNGs beside it)")
    ap.add_argument("--plot", type=Path, metavar="ROWS.json", help="only draw the PNGs of saved rows, then exit")
    ap.add_argument(
        "--into", type=Path, metavar="ROWS.json",
        help="merge this run's rows into saved rows (a row with the same config and rate is replaced, e.g. one that "
        "failed), recompute the ratios and write them back with their PNGs",
    )  # fmt: skip
    a = ap.parse_args(argv)
    if a.plot:
        rows = json.loads(a.plot.read_text())
        for path in write_outputs(rows, a.plot, rows_too=False):
            print(path)
        return 0
    configs = a.configs.split(",")
    try:
        for config in configs:
            check_config(config)
    except ValueError as exc:
        ap.error(f"--configs: {exc}")
    try:
        rates = parse_rates(a.rates) if a.rates else None
        faults = [parse_fault(f) for f in a.fault]
        check_faults(faults, yaml.safe_load(JOB.read_text())["cluster"]["regions"]["links"])
        slow_env = parse_env(a.slow_env) if a.slow_env else None
    except ValueError as exc:
        ap.error(str(exc))
    if rates and a.rate_mbps:
        ap.error("--rates and --rate-mbps: one or the other")
    if not 1 <= a.streams <= MAX_STREAMS:
        ap.error(f"--streams {a.streams}: from 1 to {MAX_STREAMS}")
    from rollart.job.spec import SpecError

    try:
        check_rows(configs, a.sets, a.rate_mbps)
    except (SpecError, ValueError) as exc:
        ap.error(str(exc))
    rows = []
    for config, rate in plan_rows(configs, rates, a.rate_mbps):
        out = run_dir(a.out.resolve(), config, rate, bool(rates), bool(faults))
        row = run_mode(
            config, out, a.steps, a.model_dir, rate, a.timeout, faults=faults, slow_env=slow_env,
            streams=a.streams, user_sets=a.sets,
        )  # fmt: skip
        print(json.dumps({k: v for k, v in row.items() if k != "timeline"}), flush=True)
        rows.append(row)
    if a.into:
        rows = merge_rows(json.loads(a.into.read_text()), rows)
        a.json = a.into
    add_ratios(rows)
    print(table(rows))
    spread = sweep_summary(rows)
    if spread:
        print(json.dumps(spread, indent=1))
    if a.json:
        for path in write_outputs(rows, a.json):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
