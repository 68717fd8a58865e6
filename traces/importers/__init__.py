"""Importers: one module per public trace format, each streaming the source into a
canonical Parquet trace (`replay trace import FORMAT SRC -o OUT.parquet`).

An importer module exposes `DOC` (one line) and
`read(src, opts, meta) -> Iterator[pa.Table]` yielding canonical columns with absolute
`arrival_ns` (exact int64 ns in the source's clock) while filling `meta` (source, time format).
Formats that can be written back also expose `export(trace, out)`; `postprocess(out, opts)`
runs on the finished file where a step needs the whole trace (e.g. `--dequantize`). Formats
that can synthesize arrivals for lengths-only files (`--rate`, `--arrivals`) set
`SYNTH_ARRIVALS = True`; every other format refuses those options.
"""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import TraceError

FORMATS = {
    "azure": "azure", "burstgpt": "burstgpt", "mooncake": "mooncake", "qwen-bailian": "qwen_bailian",
    "vidur": "vidur", "sharegpt": "sharegpt", "aibrix": "aibrix", "csv": "generic", "jsonl": "generic",
    "weka": "weka", "sglang-agentic": "sglang_agentic",
}

# Options of `replay trace import` (the CLI defines the same ones, with help).
OPTION_DEFAULTS: dict[str, Any] = {"sort": False, "drop_failed": False, "map": None, "dequantize": "none", "seed": 0,
                                   **dict.fromkeys(("quantum_ms", "tokenizer", "rate", "arrivals", "limit"))}


def module(fmt: str) -> ModuleType:
    if fmt not in FORMATS:
        raise TraceError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    return importlib.import_module(f"{__name__}.{FORMATS[fmt]}")


def import_trace(fmt: str, src: str | Path, out: str | Path, opts: argparse.Namespace | None = None,
                 **kw: Any) -> dict[str, Any]:
    """Import `src` in format `fmt` into the Parquet trace `out`; returns the metadata written.
    Options are the CLI's (`--sort`, `--drop-failed`, format options) as attributes or keywords."""
    from .sink import TraceSink
    mod = module(fmt)
    opts = argparse.Namespace(**{**OPTION_DEFAULTS, **vars(opts or argparse.Namespace()), **kw, "format": fmt})
    src, out = Path(src), Path(out)
    if not getattr(mod, "SYNTH_ARRIVALS", False):
        from .common import reject_arrival_options
        reject_arrival_options(opts, f"{fmt} files carry their own arrival times")
    if opts.dequantize != "none" and not hasattr(mod, "postprocess"):
        raise TraceError(f"--dequantize applies to bucketed formats (mooncake, aibrix), not {fmt}; import without it, then "
                         f"`replay trace transform {out.name} --dequantize '' -o OUT.parquet` spreads requests over the buckets")
    meta: dict[str, Any] = {"source": {"format": fmt, "file": src.name}}
    with TraceSink(out, file=str(src), sort=opts.sort, drop_failed=opts.drop_failed) as sink:
        for table in mod.read(src, opts, meta):
            sink.write(table)
        written = sink.close(meta)
    if hasattr(mod, "postprocess") and mod.postprocess(out, opts):
        from ..trace import Trace
        written = Trace.read_metadata(out)
    return written
