"""`replay`: one command, subcommands. Each subcommand lives in its own module that
exposes `add_parser(subparsers)`; the parser sets `func(args) -> int`.

Modules are imported to build the parser, so they must import nothing heavy at module
level (no locust, no torch): those imports belong inside the functions that run.
Errors that carry an `exit_code` attribute (TraceError, SLO spec errors, ...) are
printed as one line and exit with that code; never a traceback for bad input.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from pathlib import Path

from . import __version__

# in the order of `replay --help`: trace ..., run, worker, check, report/gate/compare/import-results, sweep, ab, demo
SUBCOMMAND_MODULES = ("llm_replay.traces.cli", "llm_replay.replay.run_cmd", "llm_replay.replay.worker", "llm_replay.replay.check",
                      "llm_replay.reports.cli", "llm_replay.replay.sweep", "llm_replay.replay.ab", "llm_replay.replay.demo")


# Other tools' names for our options (vLLM bench, genai-perf, locust, curl habits)
SYNONYMS = {"--url": "--target", "--base-url": "--target", "--endpoint": "--target", "--host": "--target",
            "--server": "--target", "--api-base": "--target", "--dataset": "--trace", "--slo-file": "--slo"}


class Parser(argparse.ArgumentParser):
    """argparse, but an option it does not know is named first, with the option meant: a
    `--taget URL` used to be reported as a missing --target."""
    argv: list[str] = []

    def error(self, message: str):
        known = set(self._option_string_actions)
        if self._subparsers is None and known:     # a (sub)command's own parser
            typos = [a.split("=")[0] for a in Parser.argv if a.startswith("--") and a.split("=")[0] not in known]
            if typos:
                message = f"unrecognized argument {typos[0]}" + did_you_mean(typos[0], known)
        super().error(message)


def did_you_mean(option: str, known) -> str:
    """' (did you mean --target?)' or ''. Compared without the dashes: with them, `--url` was
    nearest to `--slo` (the shared '--' made them look alike)."""
    meant = SYNONYMS.get(option)
    if meant not in known:
        bare = {k.lstrip("-"): k for k in known if k.startswith("--")}
        near = difflib.get_close_matches(option.lstrip("-"), bare, 1)
        meant = bare[near[0]] if near else None
    return f" (did you mean {meant}?)" if meant else ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="replay", description="Replay LLM request traces open-loop against OpenAI-compatible "
                                               "servers; report tail latency and goodput; gate on SLOs.")
    parser.add_argument("--version", action="version", version=f"llm-replay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def check_inputs(args: argparse.Namespace) -> None:
    """The input files a command names (its parser's `inputs` default: {argument: message}) exist:
    said before the command imports numpy, pyarrow or scipy, which takes seconds on a busy host."""
    from llm_replay.traces.errors import TraceError
    for name, why in getattr(args, "inputs", {}).items():
        value = getattr(args, name, None)
        try:
            if value is not None and not Path(value).exists():
                raise TraceError(why, file=str(value))
        except OSError as e:   # a name too long for the file system, a directory without x
            raise TraceError(e.strerror or str(e), file=str(value)) from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    Parser.argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        check_inputs(args)
        code = int(func(args) or 0)
        sys.stdout.flush()   # here, where a closed pipe is caught, not at exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # `replay ... | head`: the reader left; end quietly, as coreutils do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001 - only errors that declare an exit code are user errors
        code = getattr(e, "exit_code", None)
        if code is None:
            if os.environ.get("LLM_REPLAY_TRACEBACK"):
                raise
            # a bug, not the input's fault: still one line and exit 2 (exit 1 means "an SLO
            # failed" to a CI gate); LLM_REPLAY_TRACEBACK=1 shows where
            import traceback
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"error: unexpected {type(e).__name__}: {str(e)[:300]} (in {Path(where.filename).name}:{where.lineno}; "
                  "a bug: please report it with the command; LLM_REPLAY_TRACEBACK=1 shows the traceback)", file=sys.stderr)
            return 2
        print(f"error: {e}", file=sys.stderr)
        return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
