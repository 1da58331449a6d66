"""libs/ must stay light: importing every rollart module pulls in neither torch nor vllm."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import rollart
for mod in pkgutil.walk_packages(rollart.__path__, "rollart."):
    if mod.name.endswith("__main__"):
        continue
    importlib.import_module(mod.name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm", "transformers"))
print(",".join(heavy))
"""


def test_importing_all_of_libs_loads_no_torch_or_vllm():
    res = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"libs imported heavy modules: {res.stdout.strip()[:300]}"
