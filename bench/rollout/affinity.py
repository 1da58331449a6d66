"""Hardware-affinity routing (issue 12, R1): one multi-task rollout on fleets of equal cost, by routing rule.

    python -m bench affinity                      # ~10 min on 2 loaded cores
    python -m bench affinity --json out.json      # one object per configuration
    python -m bench affinity --only mix-auto --steps 2 --dilation 2

Two tasks of opposite profiles are rolled out together by the real envmanager (trajectory-level loops), leased
and batched by the real ledger, scored by the real reward service, and routed by the real LLMProxy (which
finds the actors through the real resource manager, by pool and declared kind):

- ``swe`` (prefill-heavy, like FrozenLake/SWE with a long context): ``--a-turns`` turns, each observation
  ``--a-obs`` tokens, each action ``--a-action`` tokens: every turn prefills a long new observation and decodes
  a short action;
- ``math`` (decode-heavy, like GEM math): one turn, a ``--b-prompt``-token question, a ``--b-answer``-token answer.

Actors are roofline-emulated GPUs (``bench/_support/roofline_actor.py``: Qwen3-8B on H800 or H20 by peak FLOP/s and
memory bandwidth, continuous batching with chunked prefill, a prefix cache per trajectory, PD over a 400 Gb/s
link) because this machine has no GPU; everything else is the real service. Fleets of equal cost at an
assumed rental price of 2.0 $/h per H800 and 1.0 $/h per H20 (the H20 is the cut-down export part; public
cloud listings put it at roughly half an H800's price):

| row | fleet ($8/h) | routing |
|---|---|---|
| compute-only | 4 H800 | least loaded (no rule) |
| bandwidth-only | 8 H20 | least loaded |
| mix-none | 2 H800 + 4 H20 | least loaded (the mix without affinity) |
| mix-rule | 2 H800 + 4 H20 | hand-written: swe -> pool h800, math -> pool h20 (fallback allowed) |
| mix-rule-pd | 2 H800 + 4 H20 | swe prefilled on the H800s and decoded on the H20s (PD), math -> h20 |
| mix-auto | 2 H800 + 4 H20 | ``*`` auto: the proxy classifies each task from its turns |
| mix-auto-pd | 2 H800 + 4 H20 | auto, with the same PD split as mix-rule-pd configured (prefill-heavy tasks use it) |
| mix-auto-kill | 2 H800 + 4 H20 | auto, and the H800 pool's process is SIGKILLed during the second measured step |

A step: AddPrompts (``--groups`` groups of ``--group-size`` per task), then GetBatch of every sample; its time is
reported in emulated seconds (wall / ``--dilation``). The first step of every row is a warm-up (not measured:
it is also when ``auto`` learns the profiles). Ratios are of medians over the measured steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libs"))
sys.path.insert(0, str(REPO))

from rollart_envmanager.envs.base import Env, StepResult  # noqa: E402

PRICES = {"h800": 2.0, "h20": 1.0}  # $/h per GPU (assumed, see the module docstring)
MIX = {"h800": 2, "h20": 4}
# row -> (fleet, affinity rules, PD split on the h20 pool with the h800 actors prefilling, kill the h800 pool)
CONFIGS: dict[str, tuple[dict[str, int], list[dict], bool, bool]] = {
    "compute-only": ({"h800": 4}, [], False, False),
    "bandwidth-only": ({"h20": 8}, [], False, False),
    "mix-none": (MIX, [], False, False),
    "mix-rule": (MIX, [{"task": "swe", "pool": "h800"}, {"task": "math", "pool": "h20"}], False, False),
    "mix-rule-pd": (MIX, [{"task": "swe", "pool": "h20"}, {"task": "math", "pool": "h20"}], True, False),
    "mix-auto": (MIX, [{"task": "*", "auto": True}], False, False),
    "mix-auto-pd": (MIX, [{"task": "*", "auto": True}], True, False),
    "mix-auto-kill": (MIX, [{"task": "*", "auto": True}], False, True),
}
PAPER = {"bandwidth-only": (1.30, 1.68), "compute-only": (1.12, 1.37)}


class ProfiledTask(Env):
    """``turns`` turns; every observation is ``obs`` characters (one token each with the emulated tokenizer)."""

    default_max_turns = 1000

    def __init__(self, turns: str = "1", obs: str = "300", **options) -> None:
        super().__init__(turns=turns, obs=obs, **options)
        self.turns, self.obs = int(turns), int(obs)

    def _reset(self, seed):
        self.metadata = {"seed": str(seed)}
        return f"Task {seed}. " + "x" * self.obs

    def _step(self, action):
        done = self.turn >= self.turns
        return StepResult("o" * self.obs, 1.0 if done else 0.0, done)


ENVIRONMENTS = [{"id": "bench:profiled", "factory": "bench.rollout.affinity:ProfiledTask",
                 "supported_backends": ["in_process"], "default_backend": "in_process", "default_max_turns": 1000,
                 "options": {"turns": "turns per episode", "obs": "characters per observation"}}]


def env_spec(task: str, turns: int, obs: int, max_tokens: int):
    from rollart.v1 import common_pb2 as c
    from rollart.v1 import envmanager_pb2 as em

    return em.EnvironmentSpec(environment="bench:profiled", task=task, options={"turns": str(turns), "obs": str(obs)},
                              sampling=c.SamplingParams(max_tokens=max_tokens), max_context_tokens=40000,
                              reward=c.RewardSpec(kind=c.SCORER_KIND_GAME))


class Rollout:
    """One configuration: redis + resource manager + roofline actor pools + LLMProxy, then the harness's
    ledger, reward and envmanager."""

    def __init__(self, name: str, args: argparse.Namespace, tmp: Path) -> None:
        from bench._support.envmanager_harness import TOKEN
        from rollart.local.processes import ManagedProcess, start_redis

        self.name, self.args, self.tmp = name, args, tmp
        self.fleet, self.rules, self.pd, self.kill = CONFIGS[name]
        self.procs: list = []
        self.pools: dict[str, object] = {}
        self.cluster = None
        base = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
        base.update(ROLLART_JOB_TOKEN=TOKEN, ROLLART_LOG_FORMAT="text", ROLLART_LOG_LEVEL="WARNING",
                    PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "libs")]))
        self.base = base
        self.redis, url = start_redis(tmp / "redis-rm")
        bin_ = Path(sys.executable).parent

        def start(name_: str, argv: list[str], **extra: str) -> dict:
            ready = tmp / f"{name_}.ready"
            env = dict(base, ROLLART_LISTEN="127.0.0.1:0", ROLLART_METRICS_LISTEN="127.0.0.1:0",
                       ROLLART_READY_FILE=str(ready), **extra)
            proc = ManagedProcess(name_, argv, log_path=tmp / f"{name_}.log", env=env, ready_file=ready).start()
            self.procs.append(proc)
            return proc.wait_ready(60)

        self.rm_address = start("resource-manager", [str(bin_ / "rollart-resource-manager")],
                                ROLLART_REDIS_URL=url.rsplit("/", 1)[0] + "/0")["address"]
        for pool, count in self.fleet.items():
            ready = tmp / f"pool-{pool}.ready"
            argv = [sys.executable, str(REPO / "bench" / "_support" / "roofline_actor.py"), "--kind", pool, "--count", str(count),
                    "--pool", pool, "--resource-manager", self.rm_address, "--ready", str(ready),
                    "--stats", str(tmp / f"pool-{pool}.stats"), "--dilation", str(args.dilation)]
            proc = ManagedProcess(f"pool-{pool}", argv, log_path=tmp / f"pool-{pool}.log", env=dict(base)).start()
            deadline = time.monotonic() + 60
            while not ready.exists():
                if time.monotonic() > deadline or proc.proc.poll() is not None:
                    raise RuntimeError(f"pool {pool} did not start: {(tmp / f'pool-{pool}.log').read_text()[-2000:]}")
                time.sleep(0.05)
            self.procs.append(proc)
            self.pools[pool] = proc
        px = start("llmproxy", [str(bin_ / "rollart-llmproxy")], ROLLART_RESOURCE_MANAGER=self.rm_address,
                   ROLLART_HTTP_LISTEN="none", ROLLART_STATUS_INTERVAL_SECONDS="0.5", ROLLART_ROUTE_WAIT_SECONDS="30",
                   ROLLART_AUTO_AFFINITY__SATURATION_REQUESTS=str(args.saturation),
                   ROLLART_CHUNK_TOKENS=str(args.chunk_tokens))
        self.proxy_address = px["address"]
        from bench._support.envmanager_harness import ENVIRONMENTS as _harness_envs  # noqa: F401 - the harness's module
        from bench._support.envmanager_harness import Cluster

        self.cluster = Cluster(tmp, self.proxy_address, ROLLART_ENVIRONMENTS=json.dumps(ENVIRONMENTS),
                               ROLLART_LEASE_WAIT_SECONDS="1")

    def proxy(self):
        from bench._support.envmanager_harness import MD
        from rollart.v1 import llmproxy_pb2 as pp
        from rollart.v1 import llmproxy_pb2_grpc as lg

        ch = grpc.insecure_channel(self.proxy_address)
        return ch, lg.LLMProxyStub(ch), pp, MD

    def configure(self) -> None:
        from google.protobuf.json_format import ParseDict

        ch, stub, pp, md = self.proxy()
        try:
            want = sum(self.fleet.values())
            deadline = time.monotonic() + 60
            while True:
                actors = stub.ListActors(pp.ListProxyActorsRequest(), metadata=md, timeout=10).actors
                if len([a for a in actors if a.ready and a.state == pp.PROXY_ACTOR_STATE_HEALTHY]) == want:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the proxy saw {len(actors)} of {want} actors")
                time.sleep(0.2)
            rules = [ParseDict(dict({"allow_fallback": True}, **r), pp.AffinityRule()) for r in self.rules]
            stub.SetAffinity(pp.SetAffinityRequest(rules=rules), metadata=md, timeout=10)
            if self.pd:
                prefill = [a.actor_id for a in actors if a.pool == "h800"]
                cfg = pp.PdPoolConfig(pool="h20", enabled=True, prefill_actor_ids=prefill,
                                      min_prompt_tokens=self.args.pd_min_prompt)
                stub.SetPdConfig(pp.SetPdConfigRequest(pools=[cfg]), metadata=md, timeout=10)
        finally:
            ch.close()

    def affinity(self) -> dict:
        from google.protobuf.json_format import MessageToDict

        ch, stub, pp, md = self.proxy()
        try:
            table = stub.GetAffinity(pp.GetAffinityRequest(), metadata=md, timeout=10)
            return {p.task: MessageToDict(p, preserving_proto_field_name=True) for p in table.profiles}
        finally:
            ch.close()

    def stats(self) -> dict:
        out = {}
        for pool, proc in self.pools.items():
            path = self.tmp / f"pool-{pool}.stats"
            if proc.proc.poll() is None:
                path.unlink(missing_ok=True)
                os.kill(proc.pid, signal.SIGUSR1)
                for _ in range(100):
                    if path.exists():
                        break
                    time.sleep(0.02)
            if path.exists():
                out.update(json.loads(path.read_text()))
        return out

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        for p in reversed(self.procs):
            p.stop(timeout=10)
        self.redis.stop()


def step(driver, args: argparse.Namespace, seed: int, on_started=None) -> float:
    from google.protobuf.duration_pb2 import Duration

    from bench._support.envmanager_harness import MD
    from rollart.v1 import ledger_pb2 as lg

    t0 = time.monotonic()
    for task in ("swe", "math"):
        ps = [lg.Prompt(prompt_id=f"{task}-{seed}-{i}", task=task, seed=seed * 1000 + i) for i in range(args.groups)]
        driver.ledger.AddPrompts(lg.AddPromptsRequest(prompts=ps, group_size=args.group_size), metadata=MD, timeout=30)
    if on_started is not None:
        on_started(t0)
    driver.step += 1
    total = 2 * args.groups * args.group_size
    batch = driver.ledger.GetBatch(lg.GetBatchRequest(step=driver.step, batch_size=total, wait=Duration(seconds=1800)),
                                   metadata=MD, timeout=1900)
    elapsed = time.monotonic() - t0
    driver.ledger.AckBatch(lg.AckBatchRequest(step=driver.step, batch_id=batch.batch_id), metadata=MD, timeout=30)
    if batch.samples != total:
        raise RuntimeError(f"batch has {batch.samples} samples, expected {total}")
    return elapsed / args.dilation


def run_config(name: str, args: argparse.Namespace) -> dict:
    import threading

    from bench._support.envmanager_harness import Driver

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-affinity-{name}-"))
    roll = Rollout(name, args, tmp)
    cpu0 = os.times()
    try:
        roll.configure()
        driver = Driver(roll.cluster)
        driver.setup()
        n = args.groups * args.group_size
        a = env_spec("swe", args.a_turns, args.a_obs, args.a_action)
        b = env_spec("math", 1, args.b_prompt, args.b_answer)
        from bench._support.envmanager_harness import MD
        from rollart.v1 import envmanager_pb2 as em
        for task, spec in (("swe", a), ("math", b)):
            driver.em.StartLoops(em.StartLoopsRequest(group_id=task, env=spec, count=n, max_trajectories_per_loop=0,
                                                      lease_tasks=[task]), metadata=MD, timeout=30)
        warm = step(driver, args, 0)
        times, killed_at = [], None
        for s in range(1, args.steps + 1):
            hook = None
            if roll.kill and s == min(2, args.steps):
                def hook(t0, roll=roll):
                    def later():
                        time.sleep(args.kill_after * args.dilation)
                        roll.pools["h800"].proc.send_signal(signal.SIGKILL)

                    threading.Thread(target=later, daemon=True).start()
                killed_at = s
            times.append(step(driver, args, s, hook))
        profiles = roll.affinity()
        stats = roll.stats()
        driver.em.StopLoops(em.StopLoopsRequest(group_ids=["swe", "math"], mode=em.LOOP_STOP_MODE_ABORT, wait=True),
                            metadata=MD, timeout=60)
        driver.close()
    finally:
        roll.stop()
    cpu1 = os.times()
    fleet, rules, pd, kill = CONFIGS[name]
    busy = {k: round(v["busy_s"], 2) for k, v in stats.items()}
    return {
        "config": name,
        "fleet": " + ".join(f"{n} {g.upper()}" for g, n in fleet.items()),
        "cost_per_hour": sum(PRICES[g] * n for g, n in fleet.items()),
        "routing": "; ".join(_rule_text(r) for r in rules) + (" (PD)" if pd else "") or "least loaded",
        "warmup_s": round(warm, 3),
        "step_s": [round(t, 3) for t in times],
        "median_step_s": round(statistics.median(times), 3),
        "killed_h800_in_step": killed_at,
        "profiles": {t: {k: p.get(k) for k in ("profile", "prefill_tokens_per_turn", "decode_tokens_per_turn",
                                                   "turns_per_trajectory", "fallback_turns", "last_fallback")}
                     for t, p in profiles.items()},
        "busy_s_per_actor": busy,
        "lag_s_per_actor": {k: round(v["lag_s"], 2) for k, v in stats.items()},
        "driver_cpu_s": round((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), 2),
        "load_average": os.getloadavg()[0],
    }


def _rule_text(r: dict) -> str:
    if r.get("auto"):
        return f"{r['task']} -> auto"
    return f"{r['task']} -> {r.get('pool')}"


def table(rows: list[dict]) -> str:
    by = {r["config"]: r for r in rows}

    def ratio(row: dict, ref: str) -> str:
        if ref not in by or row["config"] == ref:
            return "-"
        return f"{by[ref]['median_step_s'] / row['median_step_s']:.2f}x"

    lines = ["| config | fleet | $/h | routing | step (emulated s, median) | steps | vs compute-only | "
             "vs bandwidth-only | auto profiles (fallback turns) |", "|" + "---|" * 9]
    for r in rows:
        prof = ", ".join(f"{t}: {p['profile']} ({p.get('fallback_turns') or 0})" for t, p in sorted(r["profiles"].items())
                         if r["config"].startswith("mix-auto"))
        lines.append(f"| {r['config']} | {r['fleet']} | {r['cost_per_hour']:.0f} | {r['routing']} | "
                     f"{r['median_step_s']:.2f} | {', '.join(f'{t:.2f}' for t in r['step_s'])} | "
                     f"{ratio(r, 'compute-only')} | {ratio(r, 'bandwidth-only')} | {prof or '-'} |")
    lines.append("")
    for auto, rule in (("mix-auto", "mix-rule"), ("mix-auto-pd", "mix-rule-pd")):
        if auto in by and rule in by:
            gap = by[auto]["median_step_s"] / by[rule]["median_step_s"] - 1
            lines.append(f"{auto} vs {rule} (the same options by hand): {gap:+.1%}")
    autos = [by[n] for n in ("mix-auto", "mix-auto-pd") if n in by]
    rules = [by[n] for n in ("mix-rule", "mix-rule-pd") if n in by]
    if autos and rules:
        a = min(autos, key=lambda r: r["median_step_s"])
        best = min(rules, key=lambda r: r["median_step_s"])
        gap = a["median_step_s"] / best["median_step_s"] - 1
        lines.append(f"best auto ({a['config']}) vs the best hand-written rule ({best['config']}): {gap:+.1%} "
                     "(target within 5%)")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [r["config"] for r in rows]
    ax.bar(names, [r["median_step_s"] for r in rows], color=["#888" if not n.startswith("mix") else "#3a7" for n in names])
    for i, r in enumerate(rows):
        ax.scatter([i] * len(r["step_s"]), r["step_s"], color="k", s=10, zorder=3)
    ax.set_ylabel("rollout step time (emulated s)")
    ax.set_title("Hardware affinity at equal cost (Qwen3-8B roofline, H800 vs H20)")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=list(CONFIGS), help="these rows only")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per row (after one warm-up)")
    ap.add_argument("--groups", type=int, default=4, help="groups per task per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--a-turns", type=int, default=10)
    ap.add_argument("--a-obs", type=int, default=1500)
    ap.add_argument("--a-action", type=int, default=24)
    ap.add_argument("--b-prompt", type=int, default=300)
    ap.add_argument("--b-answer", type=int, default=1500)
    ap.add_argument("--dilation", type=float, default=2.0, help="wall seconds per emulated second")
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--saturation", type=int, default=0, help="auto_affinity.saturation_requests of the proxy")
    ap.add_argument("--pd-min-prompt", type=int, default=1024)
    ap.add_argument("--kill-after", type=float, default=2.0, help="emulated seconds into the step (mix-auto-kill)")
    ap.add_argument("--json", type=Path, help="write the rows (one object per configuration) here")
    ap.add_argument("--png", type=Path, default=REPO / "bench" / "results" / "affinity-equal-cost-fleets.png")
    args = ap.parse_args()
    rows = []
    for name in args.only or list(CONFIGS):
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_config(name, args))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    args.png.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.png)
    print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
