from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from delta_testlib import KEY, qwen3_like, same_bits, train_step

from rollart.delta import load_safetensors, save_safetensors

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

    r = run("delta", "apply", "--base", str(a), "--delta", str(d), "--out", str(c), "--key-file", str(key))
    assert r.returncode == 0, r.stderr
    assert "records no version" in r.stderr
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
            "--key-file", str(key), "--base-version", "3")  # fmt: skip
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
