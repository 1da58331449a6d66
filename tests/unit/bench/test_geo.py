"""python -m bench geo without running jobs: each row's overrides, the ratios between rows, the per-step delta
bytes read from the trainer's log, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.protocol import geo

LINKS = {"train->infer": {"rate_mbps": 0.6}, "infer->train": {"rate_mbps": 0.6}}


def test_config_sets():
    assert geo.config_sets("ideal", LINKS, None) == (["cluster.regions=null"], None)
    assert geo.config_sets("rollart", LINKS, None) == ([], 0.6)
    sets, rate = geo.config_sets("full-lag4", LINKS, 2.0)
    assert rate == 2.0 and "job.publish.weight_sync=full_checkpoint" in sets and "job.alpha=4" in sets
    assert "cluster.regions.links.train->infer.rate_mbps=2.0" in sets
    with pytest.raises(ValueError, match="unknown config"):
        geo.config_sets("full-lag3", LINKS, None)


def test_ratios_and_table():
    rows = [
        {"config": "ideal", "link_mbps": None, "samples_per_second": 8.0, "step_seconds": 4.0,
         "transfer_exposed_seconds": 0.1, "generation_seconds": 5.0},
        {"config": "rollart", "link_mbps": 0.6, "samples_per_second": 7.5, "step_seconds": 4.3,
         "transfer_exposed_seconds": 0.4, "generation_seconds": 5.0, "delta_density": 0.3},
        {"config": "full-lag1", "link_mbps": 0.6, "samples_per_second": 2.5, "step_seconds": 12.8,
         "transfer_exposed_seconds": 9.0, "generation_seconds": 5.0, "full_transfer_seconds": 14.0},
    ]  # fmt: skip
    geo.add_ratios(rows)
    assert rows[1]["ratio_to_ideal"] == pytest.approx(7.5 / 8)
    assert rows[2]["rollart_speedup"] == pytest.approx(3.0) and "rollart_speedup" not in rows[1]
    assert rows[2]["window_ratio"] == pytest.approx(14.0 / 4.0)
    text = geo.table(rows)
    assert text.splitlines()[0].startswith("config") and "3.00" in text.splitlines()[3]


def test_published_delta_bytes(tmp_path: Path):
    log = tmp_path / "cluster" / "logs" / "trainer.log"
    log.parent.mkdir(parents=True)
    lines = [
        json.dumps({"msg": "version published", "version": 0, "delta_bytes": 0}),
        json.dumps({"msg": "version published", "version": 1, "delta_bytes": 1000}),
        json.dumps({"msg": "step finished", "step": 1}),
        '{"msg": "version published", broken',
        json.dumps({"msg": "version published", "version": 2, "delta_bytes": 3000}),
    ]
    log.write_text("\n".join(lines) + "\n")
    assert geo.published_delta_bytes(tmp_path) == [1000, 3000]
    assert geo.published_delta_bytes(tmp_path / "none") == []


def test_heterogeneous_rows_slow_one_actor_and_the_uniform_row_asks_for_uniform():
    sets, rate = geo.config_sets("rollart-proportional", LINKS, None)
    assert rate == 0.6 and sets == ["cluster.env.actor-2.ROLLART_MAX_NUM_SEQS=2"]
    sets, _ = geo.config_sets("rollart-uniform", LINKS, 1.2, {"ROLLART_CPUS": "1"})
    assert "cluster.env.actor-2.ROLLART_CPUS=1" in sets and geo.UNIFORM_SET in sets
    assert "cluster.regions.links.infer->train.rate_mbps=1.2" in sets


def test_full_streams_row_stripes_the_download_and_caps_each_flow():
    sets, rate = geo.config_sets("full-streams", LINKS, None)
    assert rate == 0.6 and sets == [
        "job.publish.weight_sync=full_checkpoint", "job.alpha=1", "cluster.env.actor.ROLLART_CHECKPOINT_STREAMS=4",
        "cluster.regions.links.train->infer.flow_mbps=0.15", "cluster.regions.links.infer->train.flow_mbps=0.15",
    ]  # fmt: skip
    sets, rate = geo.config_sets("full-streams", LINKS, 2.4, streams=8)
    assert rate == 2.4 and "cluster.env.actor.ROLLART_CHECKPOINT_STREAMS=8" in sets
    assert "cluster.regions.links.train->infer.rate_mbps=2.4" in sets
    assert "cluster.regions.links.train->infer.flow_mbps=0.3" in sets
    with pytest.raises(ValueError, match="--streams 0"):
        geo.config_sets("full-streams", LINKS, None, streams=0)
    # Only the links out of the trainer's region (where the weights cross) are capped.
    sets, _ = geo.config_sets("full-streams", LINKS, None, weights_from="train")
    assert [s for s in sets if "flow_mbps" in s] == ["cluster.regions.links.train->infer.flow_mbps=0.15"]


@pytest.mark.parametrize("streams", [1, 3, 4])
def test_full_streams_overrides_load_on_the_real_job_file(streams):
    """The row's overrides on examples/geo.yaml pass the job file's checks: every link's flow is rate / S (at
    most its rate), and every actor instance gets the streams."""
    from rollart.job.spec import apply_overrides, load_job_file
    from rollart.local.cluster import SERVICE_NAMES
    from rollart.local.regions import parse_regions

    data = load_job_file(geo.JOB)
    sets, _ = geo.config_sets("full-streams", data["cluster"]["regions"]["links"], None, streams=streams)
    data = apply_overrides(data, sets)
    regions = parse_regions(data["cluster"], SERVICE_NAMES, int(data["cluster"]["actors"]))
    assert regions is not None and len(regions.links) == 2
    for link in regions.links.values():
        assert link.flow_mbps == pytest.approx(link.rate_mbps / streams) and link.flow_mbps <= link.rate_mbps
    assert str(data["cluster"]["env"]["actor"]["ROLLART_CHECKPOINT_STREAMS"]) == str(streams)
    assert data["job"]["publish"]["weight_sync"] == "full_checkpoint" and data["job"]["alpha"] == 1


def test_sweep_runs_and_folders():
    assert geo.parse_rates("sweep") == list(geo.SWEEP_RATES)
    assert max(geo.SWEEP_RATES) / min(geo.SWEEP_RATES) >= 40 and len(geo.SWEEP_RATES) >= 5
    assert geo.parse_rates("2,0.5,2") == [0.5, 2.0]
    for bad in ("", "0,1", "fast"):
        with pytest.raises(ValueError, match="--rates"):
            geo.parse_rates(bad)
    assert geo.plan_rows(["ideal", "rollart"], None, 2.0) == [("ideal", 2.0), ("rollart", 2.0)]
    runs = geo.plan_rows(["ideal", "rollart", "full-lag1"], [0.3, 0.6], None)
    assert runs == [("ideal", None), ("rollart", 0.3), ("full-lag1", 0.3), ("rollart", 0.6), ("full-lag1", 0.6)]
    out = Path("/o")
    assert geo.run_dir(out, "rollart", None, False, False) == out / "rollart"  # as before the sweep
    assert geo.run_dir(out, "full-lag1", 0.15, True, False) == out / "full-lag1@0.15"
    assert geo.run_dir(out, "ideal", None, True, True) == out / "ideal"
    assert geo.run_dir(out, "rollart", 0.6, True, True) == out / "rollart@0.6+faults"
    assert geo.parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        geo.parse_env(["A"])


def _row(config, mbps, sps, transfer, **more):
    return {"config": config, "link_mbps": mbps, "samples_per_second": sps, "step_seconds": 32 / sps,
            "transfer_exposed_seconds": transfer, "generation_seconds": 4.0, **more}  # fmt: skip


def test_ratios_at_each_rate_and_the_sweep_spread():
    rows = [_row("ideal", None, 8.0, 0.1)]
    for mbps in (0.15, 0.6, 6.0):
        rows += [_row("rollart", mbps, 6.0, 1.0 + 0.6 / mbps), _row("full-lag1", mbps, 6.0 * mbps, 14.0 * 0.6 / mbps)]
    rows += [_row("rollart-uniform", 0.6, 4.0, 1.0), _row("rollart-proportional", 0.6, 5.2, 1.0)]
    rows += [_row("rollart", 0.6, 1.0, 30.0, faults=[{"fault": "down:30@step3"}])]
    geo.add_ratios(rows)
    full = {r["link_mbps"]: r for r in rows if r["config"] == "full-lag1"}
    assert full[0.15]["rollart_speedup"] == pytest.approx(6.0 / 0.9)  # the rollart row of its own rate
    assert full[6.0]["rollart_speedup"] == pytest.approx(6.0 / 36.0)
    assert rows[-2]["proportional_gain"] == pytest.approx(1.3) and "proportional_gain" not in rows[-3]
    assert rows[-1]["ratio_to_ideal"] == pytest.approx(1 / 8)  # the fault row is measured, never a base
    spread = geo.sweep_summary(rows)
    assert set(spread) == {"rollart", "full-lag1"}  # one rate: no spread
    assert spread["rollart"]["rates"] == [0.15, 0.6, 6.0]
    assert spread["rollart"]["transfer_spread"] == pytest.approx(5.0 / 1.1)
    assert spread["full-lag1"]["bandwidth_product_spread"] == pytest.approx(1.0)
    assert "+faults" in geo.table(rows).splitlines()[-1]


def _run_folder(tmp_path: Path, steps: int = 6, faults: bool = False) -> Path:
    out = tmp_path / "run"
    out.mkdir(parents=True)
    recs = [{"kind": "validation", "score": 0.1}]
    recs += [{"step": s, "step_seconds": 5.0 + s, "get_batch_seconds": 3.0, "train_seconds": 1.0,
              "update_seconds": 0.5 * s, "finished_at": 100.0 + 10 * s} for s in range(1, steps + 1)]  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    links = {"links": {"train->infer": {"bytes": 10}}, "forwarders": {}}
    if faults:
        links["faults"] = [{"at": 1.0, "link": "*", "down_s": 30.0, "links": ["train->infer"]}]
    summary = {"steps": steps, "state": "COMPLETED", "reward_last10": 0.2, "links": links,
               "final": {"actors": {"actor-b": {"settled_tokens": 90}, "actor-a": {"settled_tokens": 30}}}}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def test_a_row_from_a_run_folder(tmp_path: Path):
    job = {"job": {"batch_size": 32}, "cluster": {"regions": {"links": LINKS}}}
    out = _run_folder(tmp_path)
    row = geo.build_row("rollart", job, 0.6, out, json.loads((out / "summary.json").read_text()), 50.0, [])
    assert row["reference"] is True and row["step_seconds"] == 9.5 and row["samples_per_second"] == 32 / 9.5
    assert row["transfer_exposed_seconds"] == 2.25 and row["train_seconds"] == 1.0
    assert [s["step"] for s in row["timeline"]] == [1, 2, 3, 4, 5, 6]
    assert row["timeline"][2] == {"step": 3, "step_seconds": 8.0, "generation_seconds": 3.0, "train_seconds": 1.0,
                                  "transfer_exposed_seconds": 1.5, "finished_at": 130.0}  # fmt: skip
    assert geo.build_row("rollart", job, 1.2, out, {}, 50.0, [])["reference"] is False
    hetero = geo.build_row("rollart-uniform", job, 0.6, out, json.loads((out / "summary.json").read_text()), 1.0, [])
    assert hetero["reference"] is False and hetero["allocation"] == "uniform"
    assert hetero["actor_settled_tokens"] == {"actor-a": 30, "actor-b": 90}
    assert hetero["settled_tokens_ratio"] == 3.0
    assert hetero["slow_actor"] == {"instance": "actor-2", "env": geo.SLOW_ENV}
    out2 = _run_folder(tmp_path / "f", faults=True)
    injected = [{"fault": "down:30@step3", "after_step": 3, "at": 2.0}]
    faulty = geo.build_row("rollart", job, 0.6, out2, json.loads((out2 / "summary.json").read_text()), 1.0, injected)
    assert faulty["reference"] is False and faulty["faults"] == injected and faulty["link_faults"][0]["down_s"] == 30
    streams = geo.build_row("full-streams", job, 0.6, out, {}, 1.0, [], streams=4)
    assert streams["reference"] is True and (streams["streams"], streams["flow_mbps"]) == (4, 0.15)


def test_faults_are_injected_while_the_run_goes(tmp_path: Path):
    """rollart_run with a stand-in for `rollart run` that writes steps: the fault lands in the links process's
    control folder once step 2 is recorded, before the run ends."""
    import sys

    from bench.protocol.geo_faults import parse_fault

    out = tmp_path / "out"
    script = (
        "import json, os, sys, time\n"
        f"out = {str(out)!r}\n"
        "os.makedirs(out, exist_ok=True)\n"
        "for s in (1, 2, 3):\n"
        "    with open(os.path.join(out, 'metrics.jsonl'), 'a') as f:\n"
        "        f.write(json.dumps({'step': s, 'step_seconds': 1.0}) + '\\n')\n"
        "    time.sleep(0.8)\n"
        "    if s == 3:\n"
        "        files = os.listdir(os.path.join(out, 'cluster', 'links-control'))\n"
        "        sys.exit(0 if files else 3)\n"
    )
    code, _, injected = geo.rollart_run([sys.executable, "-c", script], out, [parse_fault("down:30@step2")])
    assert code == 0 and [f["fault"] for f in injected] == ["down:30@step2"]
    [request] = (out / "cluster" / "links-control").glob("*.json")
    assert json.loads(request.read_text()) == [{"link": "*", "down_s": 30.0}]


def test_main_refuses_what_cannot_run(capsys):
    for argv, msg in [
        (["--configs", "rollart,full-streams", "--streams", "0"], "--streams 0: from 1 to 64"),
        (["--configs", "rollart,full-lag3"], "unknown config"),
        (["--configs", "rollart", "--rates", "sweep", "--rate-mbps", "1"], "one or the other"),
        (["--fault", "down:30@stepx"], "expected"),
        (["--fault", "a->b=down:30@step3"], "no link"),
    ]:
        with pytest.raises(SystemExit):
            geo.main(argv)
        assert msg in capsys.readouterr().err


def test_plot_only_redraws_saved_rows(tmp_path: Path):
    job = {"job": {"batch_size": 32}, "cluster": {"regions": {"links": LINKS}}}
    out = _run_folder(tmp_path)
    rows = [geo.build_row(c, job, r, out, {}, 1.0, []) | {"config": c} for c, r in
            [("ideal", None), ("rollart", 0.3), ("rollart", 1.2), ("full-lag1", 0.3), ("full-lag1", 1.2)]]  # fmt: skip
    saved = tmp_path / "rows.json"
    written = geo.write_outputs(rows, saved)
    assert [p.name for p in written] == ["rows.json", "rows-bandwidth.png", "rows-timeline.png"]
    before = saved.read_text()
    for p in written[1:]:
        p.unlink()
    assert geo.main(["--plot", str(saved)]) == 0
    assert (tmp_path / "rows-bandwidth.png").stat().st_size > 1000 and saved.read_text() == before


def test_full_streams_run_caps_the_links_out_of_the_trainers_region(geo_row_sets):
    sets = geo_row_sets("full-streams", streams=4)
    assert "cluster.env.actor.ROLLART_CHECKPOINT_STREAMS=4" in sets
    assert [s for s in sets if "flow_mbps" in s] == ["cluster.regions.links.train->infer.flow_mbps=0.15"]


def test_settlement_fields_say_whether_anything_settled_twice():
    final = {"ledger": {"settled_slots": 64, "settled_distinct_trajectories": 64, "duplicates": 3},
             "actors": {"actor-2": {"liveness": "ALIVE", "active_version": 8},
                        "actor-1": {"liveness": "ALIVE", "active_version": 8},
                        "actor-9": {"liveness": "DEAD", "active_version": 2}}}  # fmt: skip
    fields = geo.settlement_fields({"final": final})
    assert fields == {"settled_once": True, "submit_retries": 3, "actor_versions": {"actor-1": 8, "actor-2": 8}}
    final["ledger"]["settled_distinct_trajectories"] = 63
    assert geo.settlement_fields({"final": final})["settled_once"] is False
    assert geo.settlement_fields({}) == {}  # a run that never reached its final state


def test_full_rows_below_the_reference_rate_wait_longer_for_loads():
    sets, _ = geo.config_sets("full-lag1", LINKS, 0.3)
    assert "cluster.env.trainer.ROLLART_COMMIT_WAIT_SECONDS=120" in sets
    assert not [s for s in geo.config_sets("full-lag1", LINKS, 0.6)[0] if "COMMIT_WAIT" in s]  # the default holds
    assert not [s for s in geo.config_sets("rollart", LINKS, 0.3)[0] if "COMMIT_WAIT" in s]  # deltas: no loads


def test_a_failed_row_is_left_out_of_the_sweep_and_a_rerun_replaces_it():
    rows = [_row("rollart", m, 6.0, 1.0) for m in (0.3, 0.6, 6.0)]
    rows += [_row("full-lag1", m, 6.0 * m, 14.0 * 0.6 / m) for m in (0.6, 6.0)]
    failed = _row("full-lag1", 0.3, 2.9, 0.01)
    failed["state"] = "FAILED"  # its one step hid the loads that never finished
    rows.append(failed)
    spread = geo.sweep_summary(rows)
    assert spread["full-lag1"]["rates"] == [0.6, 6.0]
    rerun = _row("full-lag1", 0.3, 1.8, 28.0)
    merged = geo.merge_rows(rows, [rerun, _row("full-lag2", 0.3, 2.0, 20.0)])
    assert len(merged) == len(rows) + 1 and rerun in merged and failed not in merged
    assert geo.sweep_summary(merged)["full-lag1"]["rates"] == [0.3, 0.6, 6.0]
