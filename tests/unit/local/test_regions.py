"""cluster.regions: parsing (bad configs refused naming the field), the address plan, route rewriting and audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart.local.cluster import SERVICE_NAMES
from rollart.local.processes import ProcessError
from rollart.local.regions import RegionError, RegionPlan, Regions, file_server_argv, parse_regions
from rollart.netem.links import path_spec

LINK = {"rate_mbps": 40, "rtt_ms": 40, "jitter_ms": 2, "loss": 0.001}
GEO = {
    "place": {
        "train": ["trainer", "ledger", "resource-manager"],
        "infer": ["relay", "actor", "actor-2", "llmproxy", "envmanager", "reward"],
    },
    "links": {"train->infer": LINK, "infer->train": dict(LINK, rate_mbps=20)},
}


def _parse(regions: object, actors: int = 2):
    return parse_regions({"regions": regions}, SERVICE_NAMES, actors)


def test_compression_defaults_to_gzip_and_can_be_turned_off():
    assert _parse(GEO).compression == "gzip"
    assert _parse(dict(GEO, compression="none")).compression == "none"


def test_no_regions_is_none():
    assert parse_regions({"actors": 2}, SERVICE_NAMES, 2) is None


def test_geo_parses_with_per_direction_links():
    r = _parse(GEO)
    assert r is not None
    assert r.links[("train", "infer")].flow_mbps is None and "flow_mbps" not in r.links[("train", "infer")].to_dict()
    flows = _parse(dict(GEO, links={k: dict(v, flow_mbps=10) for k, v in GEO["links"].items()}))
    assert flows is not None and flows.links[("infer", "train")].to_dict()["flow_mbps"] == 10.0
    assert r.names == ["train", "infer"]
    assert r.region_of("actor-2") == "infer" and r.region_of("ledger") == "train"
    assert r.links[("train", "infer")].rate_mbps == 40 and r.links[("infer", "train")].rate_mbps == 20
    assert r.host("train") == "127.0.1.1" and r.forwarder_host("infer") == "127.0.2.2"


def test_a_base_name_places_every_instance():
    r = _parse({"place": {"a": [n for n in SERVICE_NAMES if n != "actor"], "b": ["actor"]},
                "links": {"a->b": LINK, "b->a": LINK}}, actors=4)  # fmt: skip
    assert r is not None and r.region_of("actor-4") == "b"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda g: g["place"].__setitem__("mars", ["nosuch"]), "cluster.regions.place.mars: unknown service 'nosuch'"),
        (lambda g: g["place"]["infer"].remove("reward"), "cluster.regions.place: reward in no region"),
        (lambda g: g["place"]["infer"].remove("actor"), "cluster.regions.place: actor in no region"),
        (lambda g: g["place"]["train"].append("reward"), "cluster.regions.place.infer: 'reward' is already in region 'train'"),
        (lambda g: g["links"]["train->infer"].__setitem__("rate_mbps", -5), "cluster.regions.links.train->infer.rate_mbps"),
        (lambda g: g["links"]["train->infer"].__setitem__("rate_mbps", 0), "cluster.regions.links.train->infer.rate_mbps"),
        (lambda g: g["links"]["train->infer"].__setitem__("loss", 0.9), "cluster.regions.links.train->infer.loss"),
        (lambda g: g["links"]["train->infer"].__setitem__("rtt_ms", "fast"), "cluster.regions.links.train->infer.rtt_ms"),
        (lambda g: g["links"]["train->infer"].__setitem__("jitter_ms", 30), "cluster.regions.links.train->infer.jitter_ms"),
        (lambda g: g["links"]["train->infer"].__setitem__("mtu", 1), "cluster.regions.links.train->infer.mtu: unknown key"),
        (lambda g: g["links"]["train->infer"].__setitem__("flow_mbps", 0), "cluster.regions.links.train->infer.flow_mbps"),
        (lambda g: g["links"]["train->infer"].__setitem__("flow_mbps", 41), "cluster.regions.links.train->infer.flow_mbps: expected a number > 0 and <= 40"),
        (lambda g: g["links"]["train->infer"].__setitem__("flow_mbps", "x"), "cluster.regions.links.train->infer.flow_mbps"),
        (lambda g: g["links"].__setitem__("train->moon", LINK), "cluster.regions.links.train->moon: region 'moon' is not defined"),
        (lambda g: g["links"].__setitem__("train->train", LINK), "cluster.regions.links.train->train: within a region"),
        (lambda g: g["links"].pop("infer->train"), "cluster.regions.links: no link infer->train"),
        (lambda g: g["links"].__setitem__("train", LINK), "cluster.regions.links.train: expected 'from->to'"),
        (lambda g: g.__setitem__("zones", {}), "cluster.regions.zones: unknown key"),
        (lambda g: g.__setitem__("compression", "zstd"), "cluster.regions.compression: 'zstd' (expected gzip"),
        (lambda g: g["place"].__setitem__("1bad", []), "cluster.regions.place: bad region name '1bad'"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_field(change, field):
    geo = json.loads(json.dumps(GEO))
    change(geo)
    with pytest.raises(RegionError) as err:
        _parse(geo)
    assert field in str(err.value)


def test_an_actor_beyond_the_job_is_refused():
    geo = json.loads(json.dumps(GEO))
    geo["place"]["infer"].append("actor-3")
    with pytest.raises(RegionError, match=r"cluster.regions.place.infer: 'actor-3' but the job starts 2 actor"):
        _parse(geo)


def test_plan_routes_every_cross_region_address_through_the_callers_forwarder(tmp_path: Path):
    regions = _parse(GEO)
    assert regions is not None
    names = ["resource-manager", "ledger", "relay", "trainer", "reward", "actor", "actor-2", "llmproxy", "envmanager"]
    plan = RegionPlan(regions, names, tmp_path, checkpoint_store="")  # no checkpoint folder: no file server
    assert plan.server is None
    ledger = plan.endpoints["ledger"]["address"]
    relay = plan.endpoints["relay"]["address"]
    assert ledger.startswith("127.0.1.1:") and relay.startswith("127.0.2.1:")
    assert plan.endpoints["relay"]["data"].startswith("127.0.2.1:")
    # One forwarder per (other region, endpoint): 9 grpc + 2 data endpoints, each reachable from one other region.
    assert len(plan.forwarders) == 11
    via = plan.route("envmanager", ledger)
    assert via.startswith("127.0.2.2:") and plan.route("trainer", ledger) == ledger
    assert plan.route("trainer", relay).startswith("127.0.1.2:")
    fwd = next(f for f in plan.forwarders if f["listen"] == via)
    assert fwd == {
        "name": "infer>ledger",
        "listen": via,
        "target": ledger,
        "up": "infer->train",
        "down": "train->infer",
    }
    env = {
        "ROLLART_LEDGER": ledger,
        "ROLLART_RELAYS": json.dumps([relay]),
        "ROLLART_REDIS_URL": "redis://127.0.0.1:6379/1",
        "PATH": "/bin",
    }
    out = plan.rewrite("trainer", env)
    assert out["ROLLART_LEDGER"] == ledger and json.loads(out["ROLLART_RELAYS"]) == [plan.route("trainer", relay)]
    assert plan.audit("trainer", out) == []
    assert plan.audit("trainer", env) == [f"ROLLART_RELAYS={relay}"]
    assert plan.audit("envmanager", {"ROLLART_LEDGER": ledger}) == [f"ROLLART_LEDGER={ledger}"]
    assert plan.audit("envmanager", {"ROLLART_LLMPROXY": "127.0.0.1:5000"}) == ["ROLLART_LLMPROXY=127.0.0.1:5000"]
    listen = plan.listen_env("trainer")
    assert listen["ROLLART_LISTEN"] == plan.endpoints["trainer"]["address"]
    assert listen["ROLLART_GRPC_COMPRESSION"] == "gzip"  # the default with regions: requests cross links
    # Actors (all in infer) fall back to the trainer's data endpoint through infer's forwarder to it.
    assert listen["ROLLART_DATA_ADVERTISE"] == plan.route("actor", plan.endpoints["trainer"]["data"])
    assert plan.audit("trainer", plan.rewrite("trainer", listen)) == []
    assert plan.audit("trainer", {"ROLLART_DATA_ADVERTISE": via}) == [f"ROLLART_DATA_ADVERTISE={via}"]
    # The relay's data endpoint as the trainer dials it: through train's forwarders, the gRPC one as the key.
    pinned = json.loads(plan.rewrite("trainer", listen)["ROLLART_RELAY_DATA_ENDPOINTS"])
    assert pinned == {plan.route("trainer", relay): plan.route("trainer", plan.endpoints["relay"]["data"])}
    assert all(v.startswith("127.0.1.2:") for v in pinned.values())


def test_the_trainers_checkpoint_folder_is_served_through_each_other_regions_link(tmp_path: Path):
    regions = _parse(GEO)
    assert regions is not None
    names = ["trainer", "ledger", "relay", "actor", "actor-2", "envmanager"]
    folder = tmp_path / "weights"
    plan = RegionPlan(regions, names, tmp_path, checkpoint_store=folder.as_uri())
    assert plan.server is not None and plan.server["dir"] == str(folder)
    assert plan.server["address"].startswith("127.0.1.1:") and plan.server["region"] == "train"
    fwd = next(f for f in plan.forwarders if f["name"] == "infer>checkpoints")
    assert fwd["target"] == plan.server["address"] and fwd["listen"].startswith("127.0.2.2:")
    assert (fwd["up"], fwd["down"]) == ("infer->train", "train->infer")  # the file's bytes come down train->infer
    for actor in ("actor", "actor-2"):
        env = plan.rewrite(actor, plan.listen_env(actor))
        assert json.loads(env["ROLLART_CHECKPOINT_ROUTES"]) == {str(folder): f"http://{fwd['listen']}/"}
        assert env["ROLLART_CHECKPOINT_CACHE"] == str(tmp_path / "checkpoint-cache" / actor)  # one cache each
        assert plan.audit(actor, env) == []
    # The trainer's region reads its folder directly; a route naming the server's real address would leak.
    assert "ROLLART_CHECKPOINT_ROUTES" not in plan.listen_env("trainer")
    leak = {"ROLLART_CHECKPOINT_ROUTES": json.dumps({str(folder): f"http://{plan.server['address']}/"})}
    assert plan.audit("actor", leak) == [f"ROLLART_CHECKPOINT_ROUTES={plan.server['address']}"]
    assert plan.to_state()["servers"] == [plan.server]
    # An S3 store is not served (every region reaches it the same way); nor is anything without a trainer.
    assert RegionPlan(regions, names, tmp_path, checkpoint_store="s3://b/p").server is None
    assert RegionPlan(regions, ["ledger", "actor"], tmp_path, checkpoint_store=str(folder)).server is None


def test_file_server_argv(tmp_path: Path):
    argv = file_server_argv(str(tmp_path), "127.0.1.1:8080", "python")
    assert argv[1:] == ["-m", "http.server", "--bind", "127.0.1.1", "--directory", str(tmp_path), "8080"]
    with pytest.raises(ValueError):
        file_server_argv(str(tmp_path), "127.0.1.1:8080", "nginx")


def test_a_started_instance_in_no_region_is_refused(tmp_path: Path):
    regions = Regions({"a": ["ledger"], "b": ["reward"]})  # `rollart up --only` may start what a job did not place
    with pytest.raises(ProcessError, match="cluster.regions.place: envmanager-2 in no region"):
        RegionPlan(regions, ["ledger", "envmanager-2"], tmp_path)


def test_link_to_path_spec():
    p = path_spec({"rate_mbps": 80, "rtt_ms": 50, "jitter_ms": 5, "loss": 0.01})
    assert p.link_rate == 10e6 and p.rtt == 0.05 and p.jitter == 0.005 and p.rate is None
    assert p.window_s == 0.1
    f = path_spec({"rate_mbps": 80, "flow_mbps": 20})  # each connection capped, all sharing the link
    assert f.rate == 2.5e6 and f.link_rate == 10e6 and f.window_s == 0.1
    # 0.04 Mbit/s = 5 kB/s: a 0.1 s window (500 B) could never hold a release (>= 1 KiB); it stretches to two.
    assert path_spec({"rate_mbps": 0.6, "flow_mbps": 0.04}).window_s == pytest.approx(2 * 1024 / 5000)
    assert 0.3 < p.stall_prob < 0.4  # 1 - 0.99 ** (65536 / 1448)
    assert p.stall_s == 0.2
    assert path_spec({"rate_mbps": 1}).stall_prob == 0.0


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("cluster.regions.links.train->infer.rate_mbps=-1", "cluster.regions.links.train->infer.rate_mbps"),
        (
            "cluster.regions.place.infer=[relay, actor, llmproxy, envmanager]",
            "cluster.regions.place: reward in no region",
        ),
        ("cluster.regions.place.mars=[]", "cluster.regions.links: no link train->mars"),
    ],
)
def test_rollart_run_refuses_bad_regions_at_load(tmp_path: Path, override: str, field: str):
    from rollart.job.run import RunOptions, run
    from rollart.job.spec import SpecError

    job = Path(__file__).resolve().parents[3] / "examples" / "geo.yaml"
    opts = RunOptions(job_file=job, out_dir=tmp_path / "out", overrides=[override])
    with pytest.raises(SpecError, match=field.replace(".", r"\.").replace("[", r"\[")):
        run(opts)
    assert not (tmp_path / "out").exists()  # refused before anything was built or started


def test_geo_example_parses():
    from rollart.job.spec import load_job_file

    data = load_job_file(Path(__file__).resolve().parents[3] / "examples" / "geo.yaml")
    regions = parse_regions(data["cluster"], SERVICE_NAMES, data["cluster"]["actors"])
    assert regions is not None and regions.names == ["train", "infer"]
    assert {regions.region_of(n) for n in ("trainer", "ledger", "resource-manager")} == {"train"}
    assert {regions.region_of(n) for n in ("relay", "actor", "actor-2", "llmproxy", "envmanager", "reward")} == {
        "infer"
    }
