"""`replay trace ...`: the trace subcommands. Each group of subcommands lives in its own
module with `add_parsers(subparsers)`; nothing heavy is imported at module level."""
from __future__ import annotations

import argparse
import importlib

TRACE_COMMAND_MODULES = (
    "llm_replay.traces.cli_io",      # import, validate, export, describe, transform
    "llm_replay.traces.cli_synth",   # generate, fit, compare
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="create, import, inspect and transform traces",
                       description="Create, import, inspect and transform request traces.")
    tsub = p.add_subparsers(dest="trace_command", metavar="TRACE_COMMAND")
    for name in TRACE_COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.add_parsers(tsub)
    p.set_defaults(func=lambda args: (p.print_help(), 0 if args.trace_command is None else 2)[1])
