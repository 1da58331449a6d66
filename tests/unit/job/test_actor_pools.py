"""``cluster.actors`` as a list of actor pools (kind, count, engine settings, CPUs) and their instances."""

from __future__ import annotations

import json

import pytest

from rollart.job.spec import SpecError, cluster_actor_pools
from rollart.local.cluster import pool_instances


def test_the_single_pool_form_keeps_working():
    assert cluster_actor_pools({}) == [] and cluster_actor_pools({"actors": 3}) == []
    with pytest.raises(SpecError, match=r"cluster\.actors: expected 1 to 64"):
        cluster_actor_pools({"actors": 0})


def test_pools_of_two_kinds_become_each_actors_environment():
    pools = cluster_actor_pools(
        {
            "actors": [
                {"pool": "h800", "kind": "gpu-compute", "count": 1, "cpus": "0", "engine": {"max_num_seqs": 8}},
                {
                    "kind": "gpu-bandwidth",
                    "count": 2,
                    "tags": ["decode"],
                    "cpus": ["1", "1"],
                    "engine": {"engine_args": {"block_size": 16}, "enable_prefix_caching": False, "dtype": "bfloat16"},
                },
            ]
        }
    )
    assert [(p.pool, p.kind, p.count) for p in pools] == [
        ("h800", "gpu-compute", 1),
        ("gpu-bandwidth", "gpu-bandwidth", 2),
    ]
    envs = pool_instances("actor", [(p.count, p.env) for p in pools])
    assert list(envs) == ["actor", "actor-2", "actor-3"]
    assert envs["actor"] == {
        "ROLLART_POOL": "h800",
        "ROLLART_POOL_KIND": "gpu-compute",
        "ROLLART_HARDWARE__TAGS": "[]",
        "ROLLART_PD_ROLE": "unified",
        "ROLLART_MAX_NUM_SEQS": "8",
        "ROLLART_CPUS": "0",
    }
    b = envs["actor-3"]
    assert b["ROLLART_POOL"] == "gpu-bandwidth" and json.loads(b["ROLLART_HARDWARE__TAGS"]) == ["decode"]
    assert json.loads(b["ROLLART_ENGINE_ARGS"]) == {"block_size": 16} and b["ROLLART_ENABLE_PREFIX_CACHING"] == "false"
    assert b["ROLLART_DTYPE"] == "bfloat16" and b["ROLLART_CPUS"] == "1"


@pytest.mark.parametrize(
    "pool, where",
    [
        ({"kind": "tpu"}, r"cluster\.actors\[0\]\.kind: unknown kind 'tpu'"),
        ({"pool": "H 800"}, r"cluster\.actors\[0\]\.pool"),
        ({"count": 0}, r"cluster\.actors\[0\]\.count"),
        ({"count": True}, r"cluster\.actors\[0\]\.count"),
        ({"tags": ["two words"]}, r"cluster\.actors\[0\]\.tags\[0\]"),
        ({"kind": "cpu", "tags": ["kind:gpu-compute"]}, r"tags\[0\]: 'kind:gpu-compute' contradicts kind 'cpu'"),
        ({"engine": {"rm_rf": 1}}, r"cluster\.actors\[0\]\.engine\.rm_rf: unknown engine setting"),
        ({"cpus": "0;reboot"}, r"cluster\.actors\[0\]\.cpus"),
        ({"count": 2, "cpus": ["0"]}, r"one CPU list per actor \(2\)"),
        ({"pd_role": "both"}, r"cluster\.actors\[0\]\.pd_role"),
        ({"colour": "red"}, r"cluster\.actors\[0\]\.colour: unknown key"),
        ({"count": 65}, r"cluster\.actors\[0\]\.count"),
    ],
)
def test_bad_pools_are_refused_with_the_field_named(pool, where):
    with pytest.raises(SpecError, match=where):
        cluster_actor_pools({"actors": [pool]})


def test_duplicate_pools_and_too_many_actors_are_refused():
    with pytest.raises(SpecError, match=r"cluster\.actors\[1\]\.pool: pool 'a' is listed twice"):
        cluster_actor_pools({"actors": [{"pool": "a"}, {"pool": "a"}]})
    with pytest.raises(SpecError, match="at most 64 actors in all"):
        cluster_actor_pools({"actors": [{"pool": f"p{i}", "count": 40} for i in range(2)]})
    with pytest.raises(SpecError, match="a number of actors or a non-empty list"):
        cluster_actor_pools({"actors": []})
