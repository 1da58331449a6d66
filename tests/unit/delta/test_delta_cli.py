from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from delta_testlib import KEY, qwen3_like, same_bits, train_step

from rollart.delta import WeightSet, cli, load_safetensors, save_safetensors, weights_digest
from rollart.delta import segment as sg
from rollart.delta.dtypes import BY_NAME

LIBS = Path(__file__).resolve().parents[3] / "libs"


def run(*args: str, env_key: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROLLART_JOB_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LIBS), env.get("PYTHONPATH")]))
    if env_key is not None:
        env["ROLLART_JOB_KEY"] = env_key
    return subprocess.run(
        [sys.executable, "-m", "rollart.delta.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def checkpoints(tmp_path: Path) -> tuple[Path, Path, Path]:
    rng = np.random.default_rng(21)
    v0 = qwen3_like(rng, layers=2, hidden=32)
    v1 = train_step(rng, v0, 0.03)
    a, b = tmp_path / "A.safetensors", tmp_path / "B.safetensors"
    v0.version = v1.version = None  # plain HF checkpoints, as a trainer would save them
    save_safetensors(a, v0)
    save_safetensors(b, v1)
    key = tmp_path / "job.key"
    key.write_bytes(KEY + b"\n")
    return a, b, key


def test_encode_inspect_apply_end_to_end(tmp_path: Path, checkpoints: tuple[Path, Path, Path]) -> None:
    a, b, key = checkpoints
    d, c = tmp_path / "D.dseg", tmp_path / "C.safetensors"
    r = run("delta", "encode", "--base", str(a), "--target", str(b), "--out", str(d), "--job", "J", "--version", "5",
            "--key-file", str(key), "--max-segment-bytes", "2048", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    enc = json.loads(r.stdout)
    assert enc["version"] == 5 and enc["base_version"] == 4 and enc["total_bytes"] == d.stat().st_size

    r = run("inspect", str(d), "--json", "--key-file", str(key))
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    for field in ("version", "base_version", "segments", "entries", "index_bytes", "value_bytes", "total_bytes",
                  "hash", "tensors"):  # fmt: skip
        assert field in info
    assert info["version"] == 5 and info["base_version"] == 4 and info["hash"] == enc["hash"]
    assert info["authenticated"] is True and info["segments"] == enc["segments"] > 2
    assert info["total_bytes"] == d.stat().st_size
    names = {t["name"] for t in info["tensors"]}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.1.mlp.gate_up_proj.weight" in names
    assert all({"name", "entries", "index_bytes"} <= t.keys() for t in info["tensors"])

    r = run("inspect", str(d))  # human table, no key: CRC + h(v) only
    assert r.returncode == 0 and "qkv_proj" in r.stdout and "authenticated False" in r.stdout

    # A plain checkpoint (no RollArt metadata) is refused as a base unless its version and hash are given
    r = run("delta", "apply", "--base", str(a), "--delta", str(d), "--out", str(c), "--key-file", str(key))
    assert r.returncode == 1 and "BaseMismatchError" in r.stderr and "--base-version" in r.stderr and not c.exists()
    r = run("delta", "apply", "--base", str(a), "--delta", str(d), "--out", str(c), "--key-file", str(key),
            "--base-version", "4")  # fmt: skip
    assert r.returncode == 1 and "BaseMismatchError" in r.stderr and "--base-hash" in r.stderr and not c.exists()
    r = run("delta", "apply", "--base", str(a), "--delta", str(d), "--out", str(c), "--key-file", str(key),
            "--base-version", "4", "--base-hash", "ab" * 32)  # fmt: skip
    assert r.returncode == 1 and "BaseMismatchError" in r.stderr and not c.exists()  # not the base it names
    r = run("delta", "apply", "--base", str(a), "--delta", str(d), "--out", str(c), "--key-file", str(key),
            "--base-version", "4", "--base-hash", "content")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out, want = load_safetensors(c), load_safetensors(b)
    assert same_bits(out, want) and out.dtypes == want.dtypes
    assert out.version == 5 and out.applied_hash is not None and out.applied_hash.hex() == info["hash"]

    # C records version 5, so the same delta again is a no-op, and the env key works as well
    c2 = tmp_path / "C2.safetensors"
    r = run("apply", "--base", str(c), "--delta", str(d), "--out", str(c2), env_key=KEY.decode())
    assert r.returncode == 0, r.stderr
    assert "already at this version" in r.stdout and same_bits(load_safetensors(c2), want)


def test_rejections_and_usage_errors(tmp_path: Path, checkpoints: tuple[Path, Path, Path]) -> None:
    a, b, key = checkpoints
    d = tmp_path / "D.dseg"
    r = run("encode", "--base", str(a), "--target", str(b), "--out", str(d), "--job", "J", "--version", "1")
    assert r.returncode == 2 and "ROLLART_JOB_KEY" in r.stderr and not d.exists()
    r = run("encode", "--base", str(a), "--target", str(b), "--out", str(d), "--job", "J", "--version", "1",
            env_key=KEY.decode())  # fmt: skip
    assert r.returncode == 0, r.stderr

    other = tmp_path / "other.key"
    other.write_bytes(b"not-the-job-key-at-all")
    r = run("apply", "--base", str(a), "--delta", str(d), "--out", str(tmp_path / "x.safetensors"),
            "--key-file", str(other))  # fmt: skip
    assert r.returncode == 1 and "AuthError" in r.stderr and not (tmp_path / "x.safetensors").exists()

    r = run("apply", "--base", str(a), "--delta", str(d), "--out", str(tmp_path / "x.safetensors"),
            "--key-file", str(key), "--base-version", "3", "--base-hash", "content")  # fmt: skip
    assert r.returncode == 1 and "BaseMismatchError" in r.stderr

    bad = tmp_path / "bad.dseg"
    blob = bytearray(d.read_bytes())
    blob[len(blob) // 3] ^= 0x40
    bad.write_bytes(bytes(blob))
    r = run("inspect", str(bad), "--json")
    assert r.returncode == 1 and "rejected" in r.stderr

    cut = tmp_path / "cut.dseg"
    cut.write_bytes(d.read_bytes()[:-10])
    r = run("apply", "--base", str(a), "--delta", str(cut), "--out", str(tmp_path / "y.safetensors"),
            "--key-file", str(key))  # fmt: skip
    assert r.returncode == 1 and "TruncatedError" in r.stderr


def test_registered_on_the_rollart_command() -> None:
    exe = shutil.which("rollart", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("rollart console script not installed")
    r = subprocess.run([exe, "delta", "inspect", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--json" in r.stdout


# ------------------------------------------------------------------- inspect checks what apply checks


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _crafted(parts: list[tuple], *, tensor_count: int | None = None, fmt: int = 2) -> bytes:
    """A delta of hand-made data segments (name, dtype, shape, part, parts, entries, index, values),
    correctly framed, signed and hashed, so that the only fault is the one put in the parts."""
    job, base_hash = b"J", weights_digest(BASE_ARRAYS, BASE_DTYPES)
    segs = []
    for seq, (name, dtype, shape, part, parts_, entries, index, values) in enumerate(parts):
        numel = int(np.prod(shape))
        segs.append(
            sg.build_data(
                key=KEY,
                job=job,
                version=1,
                base_version=0,
                seq=seq,
                name=name.encode(),
                dtype=BY_NAME[dtype],
                shape=shape,
                numel=numel,
                part=part,
                parts=parts_,
                entries=entries,
                index_stream=index,
                values=values,
                fmt=fmt,
                base_hash=base_hash if fmt == 2 else None,
            )  # fmt: skip
        )
    names = {p[0] for p in parts}
    trailer = sg.build_trailer(
        key=KEY, job=job, version=1, base_version=0, segment_count=len(segs),
        tensor_count=len(names) if tensor_count is None else tensor_count,
        total_entries=sum(p[5] for p in parts), digest=hashlib.sha256(b"".join(segs)).digest(),
        fmt=fmt, base_hash=base_hash if fmt == 2 else None,
    )  # fmt: skip
    return b"".join(segs) + trailer


BASE_ARRAYS = {"w": np.zeros(300, np.uint16), "flags": np.zeros(8, np.bool_)}
BASE_DTYPES = {"w": "BF16", "flags": "BOOL"}
V2 = b"\x80\x3f\x80\xbf"  # two bf16 values
FAULTS = {
    "good": [("w", "BF16", (300,), 0, 1, 2, b"\x03\xc6\x01", V2)],
    "non-canonical LEB128": [("w", "BF16", (300,), 0, 1, 2, b"\x83\x00\xc6\x01", V2)],
    "zero gap": [("w", "BF16", (300,), 0, 1, 2, b"\x03\x00", V2)],
    "position past numel": [("w", "BF16", (300,), 0, 1, 2, b"\x03\xaa\x02", V2)],  # 3 + 298
    "invalid BOOL value": [("flags", "BOOL", (8,), 0, 1, 1, b"\x02", b"\x02")],
    "missing part": [("w", "BF16", (300,), 0, 2, 1, b"\x03", V2[:2])],
    "repeated part": [("w", "BF16", (300,), 0, 2, 1, b"\x03", V2[:2]), ("w", "BF16", (300,), 0, 2, 1, b"\x05", V2[:2])],
    "tensor in two runs": [
        ("w", "BF16", (300,), 0, 1, 1, b"\x03", V2[:2]),
        ("flags", "BOOL", (8,), 0, 1, 1, b"\x02", b"\x01"),
        ("w", "BF16", (300,), 0, 1, 1, b"\x05", V2[:2]),
    ],
    "overlapping parts": [
        ("w", "BF16", (300,), 0, 2, 1, b"\x05", V2[:2]),
        ("w", "BF16", (300,), 1, 2, 1, b"\x05", V2[:2]),
    ],
}


@pytest.mark.parametrize("fault", list(FAULTS) + ["trailer tensor count"])
@pytest.mark.parametrize("fmt", [1, 2])
def test_inspect_rejects_what_apply_rejects_with_the_same_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, fmt: int
) -> None:
    if fault == "trailer tensor count":
        blob = _crafted(FAULTS["good"], tensor_count=2, fmt=fmt)
    else:
        blob = _crafted(FAULTS[fault], fmt=fmt)
    d, key, base = tmp_path / "D.dseg", tmp_path / "k", tmp_path / "A.safetensors"
    d.write_bytes(blob)
    key.write_bytes(KEY)
    save_safetensors(base, WeightSet(dict(BASE_ARRAYS), dict(BASE_DTYPES), version=0))
    out = tmp_path / "C.safetensors"
    apply = _cli(capsys, "apply", "--base", str(base), "--delta", str(d), "--out", str(out), "--key-file", str(key),
                 "--base-hash", "content")  # fmt: skip
    for inspect_args in ([], ["--key-file", str(key)], ["--key-file", str(key), "--base", str(base),
                                                          "--base-hash", "content"]):  # fmt: skip
        got = _cli(capsys, "inspect", str(d), *inspect_args)
        if fault == "good":
            assert apply[0] == 0 and got[0] == 0, (apply, got)
            continue
        cls = apply[2].split("(", 1)[1].split(")", 1)[0]
        assert apply[0] == 1 and "rejected" in apply[2] and not out.exists()
        assert got[0] == 1 and f"rejected ({cls})" in got[2], (fault, apply[2], got[2])
    if fault == "good":
        assert "NOT checked: base version" in _cli(capsys, "inspect", str(d), "--key-file", str(key))[1]
        assert "NOT checked" not in _cli(capsys, "inspect", str(d), "--key-file", str(key), "--base", str(base),
                                         "--base-hash", "content")[1]  # fmt: skip


def test_inspect_with_base_refuses_the_wrong_base(tmp_path: Path, checkpoints: tuple[Path, Path, Path]) -> None:
    a, b, key = checkpoints
    d = tmp_path / "D.dseg"
    assert run("encode", "--base", str(a), "--target", str(b), "--out", str(d), "--job", "J", "--version", "1",
               "--key-file", str(key)).returncode == 0  # fmt: skip
    r = run(
        "inspect", str(d), "--key-file", str(key), "--base", str(b), "--base-version", "0", "--base-hash", "content"
    )
    assert r.returncode == 1 and "BaseMismatchError" in r.stderr  # B is not the weights D names as its base
    r = run(
        "inspect", str(d), "--key-file", str(key), "--base", str(a), "--base-version", "0", "--base-hash", "content"
    )
    assert r.returncode == 0 and "NOT checked" not in r.stdout, r.stderr


@pytest.mark.parametrize("fmt", ["1", "2"])
def test_apply_of_an_unfused_delta(tmp_path: Path, checkpoints: tuple[Path, Path, Path], fmt: str) -> None:
    a, b, key = checkpoints
    d, c = tmp_path / "D.dseg", tmp_path / "C.safetensors"
    r = run("encode", "--base", str(a), "--target", str(b), "--out", str(d), "--job", "J", "--version", "1",
            "--key-file", str(key), "--no-fuse", "--format-version", fmt)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = run("inspect", str(d), "--json", "--key-file", str(key))
    names = {t["name"] for t in json.loads(r.stdout)["tensors"]}
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("qkv_proj" in n for n in names)
    r = run("apply", "--base", str(a), "--delta", str(d), "--out", str(c), "--key-file", str(key),
            "--base-version", "0", "--base-hash", "content")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert same_bits(load_safetensors(c), load_safetensors(b))
