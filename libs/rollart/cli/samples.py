"""``rollart samples RUN_DIR``: the rollout samples of a run (``<RUN_DIR>/samples.jsonl``), readable in a terminal."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rollart.job.samples import format_row, read_samples
from rollart.job.tracking import SAMPLES_FILE


def cmd_samples(args: argparse.Namespace) -> int:
    path = Path(args.run_dir)
    if path.is_dir():
        path = path / SAMPLES_FILE
    if not path.is_file():
        print(f"rollart samples: no {SAMPLES_FILE} in {args.run_dir} (written by `rollart run`, tracking.samples)",
              file=sys.stderr)
        return 1
    rows = list(read_samples(path))
    if args.task:
        rows = [r for r in rows if r.get("task") == args.task]
    steps = sorted({int(r["step"]) for r in rows})
    if args.step is not None:
        rows = [r for r in rows if int(r["step"]) == args.step]
    elif args.last:
        keep = set(steps[-args.last :])
        rows = [r for r in rows if int(r["step"]) in keep]
    if args.json:
        for r in rows:
            print(json.dumps(r, sort_keys=True))
        return 0
    if not rows:
        print(f"no samples match (steps with samples: {', '.join(map(str, steps)) or 'none'})", file=sys.stderr)
        return 1
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    width = shutil.get_terminal_size((100, 24)).columns
    print("\n\n".join(format_row(r, width=width, color=color) for r in rows))
    return 0


def add_subparsers(sub: Any) -> None:
    p = sub.add_parser("samples", help="print a run's sampled trajectories (prompt, turns, reward, version)")
    p.add_argument("run_dir", help="the run's output folder (e.g. runs/frozenlake) or its samples.jsonl")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--last", type=int, default=0, help="only the last N sampled steps")
    p.add_argument("--task", help="only this task")
    p.add_argument("--json", action="store_true", help="the rows as JSON lines")
    p.set_defaults(func=cmd_samples)
