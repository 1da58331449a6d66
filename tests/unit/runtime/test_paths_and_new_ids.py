"""rollart.runtime.validation's path/uri/model checks, errors.Coded, and ids.new_id."""

from __future__ import annotations

import grpc
import pytest

from rollart.runtime import errors, ids
from rollart.runtime import validation as v

RTL = "\u202e"  # RIGHT-TO-LEFT OVERRIDE
LONG_UNICODE = ("\u200f" + "🧪" + "é") * 1400  # RTL marks, emoji: 4,200 characters, ~9 KB


@pytest.mark.parametrize(
    "value, why",
    [
        ("a\x00b", "NUL"),
        ("model" + RTL + "gpj.exe", "U+202E"),
        ("a\u200fb", "U+200F"),
        ("line\nbreak", "U+000A"),
        ("x" * 2000, "at most 1024 characters"),
        ("dir/" + "é" * 200, "path component over 255 bytes"),
    ],
)
def test_path_refuses_what_the_file_system_cannot_take(value, why):
    with pytest.raises(errors.InvalidArgument) as info:
        v.path("spec.model", value)
    assert info.value.field == "spec.model" and why in info.value.details()
    assert len(errors.status_of(info.value)[1].encode()) <= errors.MAX_DETAILS_BYTES


def test_path_bounds_bytes_where_characters_allow_more():
    with pytest.raises(errors.InvalidArgument, match="at most 4096 bytes"):
        v.path("p", "🧪/" * 1500, max_chars=5000)


def test_path_accepts_ordinary_paths_and_unicode_names():
    assert v.path("p", "/data/models/qwen-0.6b") == "/data/models/qwen-0.6b"
    assert v.path("p", "/data/mödèls/🧪/ckpt") == "/data/mödèls/🧪/ckpt"
    assert v.path("p", "") == ""
    with pytest.raises(errors.InvalidArgument, match="is required"):
        v.path("p", "", required=True)


def test_uri_checks_scheme_and_parser():
    assert v.uri("u", "s3://bucket/key") == "s3://bucket/key"
    assert v.uri("u", "/local/file.jsonl") == "/local/file.jsonl"
    for bad, why in [
        ("http://[::1/x", "not a valid URI"),
        ("http://host:99999999/x", "not a valid URI"),
        ("ftp://host/x", "must be a path or"),
        ("https://host/a b", "whitespace"),
        ("https://host/" + LONG_UNICODE, "at most"),
    ]:
        with pytest.raises(errors.InvalidArgument, match=why):
            v.uri("u", bad)


def test_model_is_a_hub_name_or_a_clean_path():
    assert v.model("m", "Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert v.model("m", "/models/x") == "/models/x"
    for bad in (LONG_UNICODE, "Qwen\x00", RTL + "x"):
        with pytest.raises(errors.InvalidArgument):
            v.model("m", bad)


def test_coded_errors_keep_their_code_and_map_once():
    by_name = errors.Coded("FAILED_PRECONDITION", "based on v1")
    assert by_name.code == "FAILED_PRECONDITION" and by_name.status == grpc.StatusCode.FAILED_PRECONDITION
    assert errors.status_of(by_name)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "based on v1")
    by_enum = errors.Coded(grpc.StatusCode.DATA_LOSS, "m", trailing=[("k", "v")])
    assert errors.status_of(by_enum) == (grpc.StatusCode.DATA_LOSS, "m", (("k", "v"),))
    assert errors.Coded("NO_SUCH_CODE", "m").status == grpc.StatusCode.UNKNOWN
    huge = errors.Coded("ABORTED", "x" * 100_000)
    assert len(errors.status_of(huge)[1].encode()) <= errors.MAX_DETAILS_BYTES


def test_new_id_is_a_valid_unique_id():
    minted = {ids.new_id("traj") for _ in range(1000)}
    assert len(minted) == 1000
    for value in minted:
        assert value.startswith("traj-") and ids.is_id(value) and len(value) == len("traj-") + 2 * ids.NEW_ID_BYTES
    assert ids.is_id(ids.new_id("job7-v3", nbytes=6))
    with pytest.raises(ValueError):
        ids.new_id("bad prefix")
    with pytest.raises(ValueError):
        ids.new_id("x", nbytes=2)
