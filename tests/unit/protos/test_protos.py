"""The protos: committed stubs are current, and every element of the API is documented."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[3]
PROTOS = sorted((REPO / "protos" / "rollart" / "v1").glob("*.proto"))
SERVICES = {"resource_manager", "ledger", "trainer", "relay", "actor", "llmproxy", "envmanager", "reward"}
INCLUDE = str(Path(protoc.__file__).parent / "_proto")


def _protoc(*args: str) -> None:
    rc = protoc.main(["grpc_tools.protoc", "-I", str(REPO / "protos"), "-I", INCLUDE, *args, *map(str, PROTOS)])
    assert rc == 0, f"protoc failed ({rc})"


def test_every_service_has_a_proto():
    assert {p.stem for p in PROTOS} >= SERVICES | {"common"}


def test_committed_stubs_are_not_stale(tmp_path):
    _protoc(f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}")
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / "rollart" / "v1").glob("*"))
    committed = REPO / "libs"
    stale = [str(p) for p in generated if not filecmp.cmp(tmp_path / p, committed / p, shallow=False)]
    missing = [str(p) for p in generated if not (committed / p).exists()]
    assert not missing, f"stubs missing from libs/: {missing}; run `make protos`"
    assert not stale, f"stubs out of date with protos/: {stale}; run `make protos` and commit"
    extra = {p.name for p in (committed / "rollart" / "v1").glob("*_pb2*")} - {p.name for p in generated}
    assert not extra, f"stubs without a .proto: {extra}"


def _descriptor_set(tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    out = tmp_path / "set.pb"
    _protoc("--include_source_info", f"--descriptor_set_out={out}")
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _undocumented(fd: descriptor_pb2.FileDescriptorProto) -> list[str]:
    comments = {
        tuple(loc.path): (loc.leading_comments + loc.trailing_comments).strip() for loc in fd.source_code_info.location
    }
    missing = []

    def check(path: tuple[int, ...], what: str) -> None:
        if not comments.get(path):
            missing.append(f"{fd.name}: {what}")

    def message(m: descriptor_pb2.DescriptorProto, path: tuple[int, ...], prefix: str) -> None:
        name = f"{prefix}{m.name}"
        check(path, f"message {name}")
        for i, f in enumerate(m.field):
            check(path + (2, i), f"field {name}.{f.name}")
        for i, nested in enumerate(m.nested_type):
            if not nested.options.map_entry:
                message(nested, path + (3, i), name + ".")
        for i, e in enumerate(m.enum_type):
            enum(e, path + (4, i), name + ".")

    def enum(e: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], prefix: str) -> None:
        check(path, f"enum {prefix}{e.name}")
        for i, v in enumerate(e.value):
            if v.number != 0:  # the _UNSPECIFIED zero value speaks for itself
                check(path + (2, i), f"enum value {v.name}")

    for i, m in enumerate(fd.message_type):
        message(m, (4, i), "")
    for i, e in enumerate(fd.enum_type):
        enum(e, (5, i), "")
    for i, s in enumerate(fd.service):
        check((6, i), f"service {s.name}")
        for j, meth in enumerate(s.method):
            check((6, i, 2, j), f"rpc {s.name}.{meth.name}")
    return missing


def test_every_message_field_and_rpc_is_documented(tmp_path):
    fds = _descriptor_set(tmp_path)
    missing = [m for fd in fds.file if fd.name.startswith("rollart/") for m in _undocumented(fd)]
    assert not missing, f"{len(missing)} undocumented elements, e.g.:\n" + "\n".join(missing[:40])


@pytest.mark.parametrize("module", sorted(SERVICES))
def test_each_service_stub_imports(module):
    import importlib

    mod = importlib.import_module(f"rollart.v1.{module}_pb2_grpc")
    assert any(name.endswith("Servicer") for name in dir(mod))
