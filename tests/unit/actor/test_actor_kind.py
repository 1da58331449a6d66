"""The actor's declared hardware kind and tags (what it registers with the resource manager)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollart_actor.config import ActorConfig
from rollart_actor.hardware import detect_hardware


def cfg(**kw) -> ActorConfig:
    return ActorConfig(model="/models/tiny", insecure_disable_auth=True, **kw)


def test_a_pool_kind_set_on_purpose_is_declared_as_a_kind_tag():
    hw = detect_hardware(cfg(pool="h20", pool_kind="gpu-bandwidth", hardware={"tags": ["decode"]}), "cpu")
    assert list(hw.tags) == ["decode", "kind:gpu-bandwidth"]
    # The default kind is not declared: an actor joining an existing pool takes that pool's kind.
    assert list(detect_hardware(cfg(pool="h800"), "cpu").tags) == []


@pytest.mark.parametrize(
    "tags, where",
    [
        (["two words"], "tags[0]"),
        (["ok", "tab\tbed"], "tags[1]"),
        (["x" * 129], "tags[0]"),
        (["kind:tpu"], "unknown kind"),
        (["kind:cpu", "kind:gpu-compute"], "declare kind"),
    ],
)
def test_malformed_tags_and_kinds_are_refused(tags, where):
    with pytest.raises(ValidationError, match=where.replace("[", r"\[").replace("]", r"\]")):
        cfg(hardware={"tags": tags})


def test_a_kind_tag_must_agree_with_pool_kind():
    with pytest.raises(ValidationError, match="pool_kind is 'gpu-compute'"):
        cfg(pool_kind="gpu-compute", hardware={"tags": ["kind:gpu-bandwidth"]})
    assert cfg(pool_kind="gpu-compute", hardware={"tags": ["kind:gpu-compute"]})
