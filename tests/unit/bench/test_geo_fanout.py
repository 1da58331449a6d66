"""The relay's egress rows of python -m bench geo (relay-nN, direct-nN) and its --set, without running jobs: the
overrides on examples/geo.yaml pass rollart run's checks and place every actor; the direct row's actors reach
the trainer only through their region's link; the egress read from the links process's counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.protocol import geo, geo_fanout


def _job(config: str, user_sets: list[str] | None = None) -> dict:
    from rollart.job.spec import apply_overrides, load_job_file

    data = load_job_file(geo.JOB)
    sets, _, _ = geo.row_sets(config, data, None, user_sets=user_sets)
    return apply_overrides(data, sets)


def _regions(data: dict):
    from rollart.local.cluster import SERVICE_NAMES
    from rollart.local.regions import parse_regions

    return parse_regions(data["cluster"], SERVICE_NAMES, int(data["cluster"]["actors"]))


@pytest.mark.parametrize("n", [2, 4])
def test_relay_rows_place_n_actors_beside_the_relay(n):
    data = _job(f"relay-n{n}")
    regions = _regions(data)
    assert data["cluster"]["actors"] == n
    actors = ["actor"] + [f"actor-{i}" for i in range(2, n + 1)]
    assert [regions.region_of(a) for a in actors] == ["infer"] * n
    assert regions.region_of("relay") == "infer" and regions.region_of("trainer") == "train"
    assert "actor-3" in data["cluster"]["regions"]["place"]["infer"] or n == 2  # placed by name, not by service
    assert "ROLLART_WEIGHT_SOURCE__RELAY_ENDPOINT" not in ((data["cluster"].get("env") or {}).get("actor") or {})


def test_direct_row_moves_the_relay_and_sends_the_actors_to_the_trainer(tmp_path: Path):
    """direct-n4: the relay beside the trainer; each actor's first source a closed port of its own region (the
    launcher's audit lets it through: no address of another region), so it follows its fallback, the trainer,
    whose data endpoint is advertised as the actors' region's forwarder: every delta pull crosses the link."""
    from rollart.local.regions import RegionPlan

    data = _job("direct-n4")
    regions = _regions(data)
    assert regions.region_of("relay") == "train" and regions.region_of("actor-4") == "infer"
    endpoint = data["cluster"]["env"]["actor"][geo_fanout.RELAY_ENDPOINT_ENV]
    assert endpoint == f"{regions.host('infer')}:{geo_fanout.CLOSED_PORT}"
    names = ["resource-manager", "ledger", "relay", "trainer", "reward", "actor", "actor-2", "actor-3", "actor-4",
             "llmproxy", "envmanager"]  # fmt: skip
    plan = RegionPlan(regions, names, tmp_path, checkpoint_store="")
    trainer = plan.endpoints["trainer"]
    for actor in ("actor", "actor-3", "actor-4"):
        env = plan.rewrite(actor, {geo_fanout.RELAY_ENDPOINT_ENV: endpoint,
                                   "ROLLART_WEIGHT_SOURCE__FALLBACK_ENDPOINTS": json.dumps([trainer["address"]])})  # fmt: skip
        assert plan.audit(actor, env) == [] and env[geo_fanout.RELAY_ENDPOINT_ENV] == endpoint
        [fallback] = json.loads(env["ROLLART_WEIGHT_SOURCE__FALLBACK_ENDPOINTS"])
        assert fallback == plan.route(actor, trainer["address"]) and fallback.startswith("127.0.2.2:")
    assert plan.listen_env("trainer")["ROLLART_DATA_ADVERTISE"] == plan.route("actor", trainer["data"])
    fwd = next(f for f in plan.forwarders if f["name"] == "infer>trainer/data")
    assert fwd["down"] == "train->infer"  # the pulled deltas: callee (trainer) -> caller (actors)


def test_fanout_configs_are_checked():
    assert geo.check_config("relay-n4") == ("relay", 4) and geo.check_config("direct-n2") == ("direct", 2)
    assert geo.check_config("rollart") is None
    for bad in ("relay-n0", "direct-n9", "relay-4", "relay-nx"):
        with pytest.raises(ValueError):
            geo.check_config(bad)
    with pytest.raises(ValueError, match="two regions"):
        geo_fanout.fanout_sets("relay", 2, {"all": ["trainer", "actor", "relay"]})
    sets, rate = geo.config_sets("direct-n2", {"a->b": {"rate_mbps": 1.0}}, None, place={"a": ["trainer"], "b": ["relay", "actor"]})  # fmt: skip
    assert rate == 1.0 and 'cluster.regions.place.a=["trainer", "relay"]' in sets
    assert 'cluster.regions.place.b=["actor", "actor-2"]' in sets


def test_set_applies_to_every_row_and_the_ideal_row_skips_regions():
    data = geo.yaml.safe_load(geo.JOB.read_text())
    user = ["job.grpo.learning_rate=2e-5", "cluster.regions.links.train->infer.rtt_ms=80"]
    for config in ("rollart", "full-lag1", "relay-n4", "direct-n2"):
        sets, _, applied = geo.row_sets(config, data, None, user_sets=user)
        assert applied == user and sets[-2:] == user  # after the row's own: the user's word is last
    sets, rate, applied = geo.row_sets("ideal", data, None, user_sets=user)
    assert rate is None and applied == user[:1] and sets == ["cluster.regions=null", user[0]]
    job = _job("direct-n4", user)
    assert float(job["job"]["grpo"]["learning_rate"]) == pytest.approx(2e-5)  # "2e-5": YAML 1.1 says str
    assert job["cluster"]["regions"]["links"]["train->infer"]["rtt_ms"] == 80
    geo.check_rows(["ideal", "rollart", "relay-n2", "direct-n4", "full-lag4"], user)


def test_main_refuses_a_bad_set_before_running(capsys, monkeypatch):
    monkeypatch.setattr(geo, "run_mode", lambda *a, **k: pytest.fail("nothing runs"))
    for argv, msg in [
        (["--configs", "rollart", "--set", "job.grpo.no_such_field=1"], "no_such_field"),
        (["--configs", "rollart", "--set", "nokey"], "KEY=VALUE"),
        (["--configs", "relay-n4", "--set", "cluster.actors=2"], "actor-3"),
        (["--configs", "relay-n12"], "N from 1 to 8"),
        (["--configs", "relay-n"], "unknown config"),
    ]:
        with pytest.raises(SystemExit):
            geo.main(argv)
        assert msg in capsys.readouterr().err


def test_run_mode_passes_the_sets_and_the_row_records_them(geo_row_sets):
    sets = geo_row_sets("direct-n4", user_sets=["job.grpo.learning_rate=2e-5"])
    assert "cluster.actors=4" in sets and sets[-1] == "job.grpo.learning_rate=2e-5"
    assert any(s.startswith("cluster.env.actor.ROLLART_WEIGHT_SOURCE__RELAY_ENDPOINT=") for s in sets)


def _counters(data_bytes: int, via: str) -> dict:
    """links.json as the links process writes it: weight bytes through the relay's data forwarder (pushed by the
    trainer: up) or the trainer's (pulled by the actors: down), plus lease traffic that is not weights."""
    fwd = {
        "infer>ledger": {"up_link": "infer->train", "down_link": "train->infer", "bytes_up": 500, "bytes_down": 900},
        "infer>checkpoints": {"up_link": "infer->train", "down_link": "train->infer", "bytes_up": 10, "bytes_down": 0},
    }
    if via == "relay":
        fwd["train>relay/data"] = {"up_link": "train->infer", "down_link": "infer->train", "bytes_up": data_bytes,
                                   "bytes_down": 40}  # fmt: skip
    else:
        fwd["infer>trainer/data"] = {"up_link": "infer->train", "down_link": "train->infer", "bytes_up": 40,
                                     "bytes_down": data_bytes}  # fmt: skip
    return {"links": {"train->infer": {"bytes": data_bytes + 900}, "infer->train": {"bytes": 550}}, "forwarders": fwd}


def test_weights_egress_counts_only_the_weight_forwarders_out_of_the_trainers_region():
    assert geo_fanout.weights_egress(_counters(1000, "relay"), "train") == {"data": 1000, "checkpoints": 0}
    assert geo_fanout.weights_egress(_counters(4000, "direct"), "train") == {"data": 4000, "checkpoints": 0}
    assert geo_fanout.weights_egress(_counters(4000, "direct"), "infer") == {"data": 40, "checkpoints": 10}
    row = geo_fanout.egress_fields(_counters(4100, "direct"), "train", [1000, 1050])
    assert row["weights_egress_bytes"] == 4100 and row["weights_egress_per_version"] == 2050
    assert row["weights_egress_per_delta"] == pytest.approx(2.0)
    assert geo_fanout.egress_fields({}, None, [1]) == {}


def _folder(tmp_path: Path, name: str, data_bytes: int, via: str, deltas: list[int]) -> Path:
    out = tmp_path / name
    (out / "cluster" / "logs").mkdir(parents=True)
    recs = [{"step": s, "step_seconds": 6.0, "get_batch_seconds": 4.0, "update_seconds": 1.0} for s in range(1, 6)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    log = [{"msg": "version published", "version": v, "delta_bytes": b} for v, b in enumerate([0, *deltas])]
    (out / "cluster" / "logs" / "trainer.log").write_text("".join(json.dumps(r) + "\n" for r in log))
    (out / "model.safetensors").write_bytes(b"\0" * 10_000)
    (out / "summary.json").write_text(json.dumps({"steps": 5, "links": _counters(data_bytes, via)}))
    return out


def test_rows_report_egress_density_and_the_relay_over_direct_ratio(tmp_path: Path):
    job = geo.yaml.safe_load(geo.JOB.read_text())
    deltas = [1000] * 5
    rows = []
    for n in (2, 4):
        for kind, copies in (("relay", 1.02), ("direct", n * 1.02)):
            out = _folder(tmp_path, f"{kind}{n}", int(5000 * copies), kind, deltas)
            summary = json.loads((out / "summary.json").read_text())
            rows.append(geo.build_row(f"{kind}-n{n}", job, 0.6, out, summary, 1.0, [], sets=["job.x=1"]))
    out = _folder(tmp_path, "full", 0, "relay", deltas)
    rows.append(geo.build_row("full-lag1", job, 0.6, out, {"steps": 5}, 1.0, []))
    geo.add_ratios(rows)
    by = {r["config"]: r for r in rows}
    assert by["relay-n4"]["relay_egress_ratio"] == pytest.approx(0.25) and by["relay-n4"]["egress_target"] == 0.25
    assert by["relay-n2"]["relay_egress_ratio"] == pytest.approx(0.5) and "relay_egress_ratio" not in by["direct-n2"]
    assert by["direct-n4"]["weights_egress_per_version"] == pytest.approx(4 * 1.02 * 1000)
    assert by["relay-n2"]["fanout"] == "relay" and by["direct-n4"]["actors"] == 4
    assert all(r["reference"] is False for c, r in by.items() if c != "full-lag1") and by["full-lag1"]["reference"]
    assert by["relay-n2"]["sets"] == ["job.x=1"] and by["full-lag1"]["sets"] == []
    for r in rows:  # every row, full-weight ones included: the trainer encodes the delta in every mode
        assert r["delta_density"] == pytest.approx(0.1) and r["delta_bytes_per_step"] == 1000
    assert "0.250" in geo.table(rows)


def test_a_set_of_the_link_or_the_model_makes_a_row_no_reference(tmp_path: Path):
    job = geo.yaml.safe_load(geo.JOB.read_text())
    out = _folder(tmp_path, "r", 5000, "relay", [1000])
    for sets, reference in [([], True), (["job.grpo.learning_rate=2e-5"], True), (["model.hidden=256"], False),
                            (["cluster.regions.links.train->infer.rtt_ms=80"], False)]:  # fmt: skip
        assert geo.build_row("rollart", job, 0.6, out, {}, 1.0, [], sets=sets)["reference"] is reference
    empty = tmp_path / "e"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_seconds": 1.0}) + "\n")
    row = geo.build_row("ideal", job, None, empty, {}, 1.0, [])
    assert row["delta_density"] is None and row["delta_bytes_per_step"] is None  # no version published: said so
