"""scripts/gpu-check.sh's logic without a GPU: arguments, the plan, and the one table it prints."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def load_module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arguments() -> None:
    gc = load_module()
    a = gc.parse_args([])
    assert a.shape == "0.6b" and a.skip == [] and not a.cpu
    assert gc.SHAPES["0.6b"]["num_key_value_heads"] == 8 and gc.SHAPES["0.6b"]["vocab_size"] == 151936
    c = gc.parse_args(["--cpu", "--skip", "delta"])
    assert c.shape == "tiny" and c.skip == ["delta"]


def test_table_has_every_figure_and_dashes_for_missing_ones() -> None:
    gc = load_module()
    table = gc.format_table(
        {
            "train": {"fsdp2_step_s": 1.234, "megatron_step_s": 2.0},
            "delta": {"encode_s": 0.5, "apply_s": 0.25, "delta_mb": 12.34, "bucket_s": "0.10/0.20"},
        }
    )
    head, rule, row = table.splitlines()
    assert head.split(" | ")[0] == "| vllm tokens/s" and "update pause s" in head and "delta encode s" in head
    assert rule.count("---:") == len(gc.COLUMNS)
    assert row == "| - | 1.23 | 2.00 | - | 0.50 | 0.25 | 12.3 | 0.10/0.20 | - | - |"
    # Pipeline parallel: seconds where it ran, what kept it from running otherwise.
    assert "| 0.75 |" in gc.format_table({"pp": {"pp2_step_s": "0.75"}})
    assert "| needs 2 GPUs |" in gc.format_table({"pp": {"pp2_step_s": "needs 2 GPUs"}})


def test_dry_run_through_the_shell_script() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "phases model, train, pp, delta, vllm" in lines[0] and "(dry run)" in lines[0]
    assert "megatron pp2 step s" in lines[1]
    assert lines[-1].startswith("| -") and len(lines) == 4
