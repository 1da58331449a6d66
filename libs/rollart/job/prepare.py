"""The model of a ``rollart run`` job whose ``job.model`` is ``tiny``: the warm-started tiny model of the job file's
``model`` section, built by ``rollart-devtools warmstart`` in a child process (this package stays torch-free) and
cached by recipe."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, TextIO

from rollart.local import cluster as local
from rollart.local.processes import ProcessError

from .spec import SpecError


def prepare_model(model_section: dict[str, Any], out_root: Path, log: TextIO) -> Path:
    """Build (or reuse) the warm-started tiny model described by the job file's ``model`` section."""
    builder = str(model_section.get("builder", "tiny"))
    if builder != "tiny":
        raise SpecError(f"model.builder: unknown builder {builder!r} (tiny)")
    # model.lora configures the job's adapter (the trainer and actors read it), not the base model's recipe
    recipe = {k: v for k, v in model_section.items() if k not in ("builder", "lora")}
    default = "mix" if recipe.get("mix") else str(recipe.get("warm_start", "plain"))
    name = str(recipe.pop("name", "tiny-" + default))
    out = Path(str(recipe.pop("dir", ""))) if recipe.get("dir") else out_root / "models" / name
    devtools = local.find_script("rollart-devtools")
    if devtools is None:
        raise ProcessError("building the model needs rollart-devtools (pip install -e tools; `make setup` does)")
    argv = [devtools, "warmstart", "--out", str(out)]
    flags = {
        "warm_start": "--task",
        "episodes": "--episodes",
        "p_expert": "--p-expert",
        "max_turns": "--max-turns",
        "layers": "--layers",
        "hidden": "--hidden",
        "vocab": "--vocab",
        "pretrain_steps": "--pretrain-steps",
        "seed": "--seed",
    }
    for key, value in recipe.items():
        if key == "options":
            for k, v in (value or {}).items():
                argv += ["--option", f"{k}={v}"]
        elif key == "mix":  # multi-task jobs: one warm start on every task's dialogs
            if not isinstance(value, list) or not value or not all(isinstance(e, dict) for e in value):
                raise SpecError("model.mix: expected a list of per-task recipes (task, episodes, p_expert, ...)")
            argv += ["--mix", json.dumps(value, sort_keys=True)]
        elif key in flags:
            argv += [flags[key], str(value)]
        else:
            raise SpecError(f"model.{key}: unknown key (known: builder, name, dir, options, mix, {', '.join(flags)})")
    print(f"model            building {out} (warm start; cached by recipe)", file=log, flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ProcessError(f"building the model failed:\n{proc.stderr[-3000:]}")
    info = json.loads(proc.stdout[proc.stdout.index("{") :])
    what = "reused" if info.get("cached") else f"built in {time.monotonic() - t0:.0f}s"
    print(
        f"model            {what}: {info.get('parameters')} parameters, "
        f"warm-start expert success {info.get('expert_success_rate')}",
        file=log,
        flush=True,
    )
    return out
