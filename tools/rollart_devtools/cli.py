"""``rollart-devtools``: the developer tooling's one command line.

rollart-devtools tiny-model --out DIR [...]            a tiny Qwen3 checkpoint with a locally trained tokenizer
rollart-devtools warmstart --out DIR --task frozenlake  the tiny model warm-started on the task (cached by recipe)
rollart-devtools engine-probe --model DIR              check every vLLM facility the actor relies on
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import engine_probe, tiny_model, warmstart

# command -> (module with add_arguments(parser) and run(args), one-line help)
COMMANDS = {
    "tiny-model": (tiny_model, "build a tiny Qwen3 checkpoint with a locally trained tokenizer"),
    "warmstart": (warmstart, "build the tiny model warm-started on a task's dialogs (cached by recipe)"),
    "engine-probe": (engine_probe, "start vLLM on a checkpoint and check what the actor relies on"),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollart-devtools", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, summary) in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=summary, description=summary))
    args = parser.parse_args(argv)
    return int(args.func(args))
