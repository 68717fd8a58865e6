"""ShareGPT conversations: a JSON list (or JSON lines) of `{"id", "conversations": [{"from", "value"}]}`.

Each human/user message followed by a gpt/assistant reply is one request: `prompt` = the
message text (kept verbatim), `input_tokens` / `output_tokens` = lengths of the message and
the reply, `session_id` = the conversation id, `turn` = 0-based index of the exchange,
`parent_id` = the previous exchange. Lengths come from `--tokenizer tokenizer.json` (the
`tokenizers` package) when given; otherwise they are estimated as ceil(UTF-8 bytes / 4)
and the metadata says so. The source has no times: arrivals are a seeded renewal process
(`--rate`, default 1 req/s, `--arrivals poisson|gamma:CV|weibull:CV`, `--seed`). The file is
parsed incrementally, one conversation at a time.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import TraceError
from .common import SynthArrivals, arrival_process, check_file

DOC = "ShareGPT JSON: [{id, conversations: [{from: human|gpt, value}]}]; lengths by tokenizer or estimate"
SYNTH_ARRIVALS = True  # the source has no times: --rate (default 1 req/s), --arrivals
USER, ASSISTANT = {"human", "user"}, {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


def iter_json_items(path: Path, chunk: int = 1 << 20) -> Iterator[Any]:
    """Items of a top-level JSON array (or JSON lines), decoded one at a time."""
    check_file(path)
    dec, n, eof = json.JSONDecoder(), 0, False
    with open(path, encoding="utf-8") as f:
        try:
            buf = f.read(chunk).lstrip()
            array = buf.startswith("[")
            pos = int(array)
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n" + ("," if n else ""):
                    pos += 1
                if array and buf[pos:pos + 1] == "]":
                    return
                if pos >= len(buf) and eof:
                    if array:
                        raise TraceError("unterminated JSON array", file=str(path))
                    return
                try:
                    item, pos = dec.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    if eof:
                        raise TraceError(f"invalid JSON in item {n}: {e.msg} (char {e.pos})", file=str(path)) from None
                    more = f.read(chunk)
                    eof, buf, pos = not more, buf[pos:] + more, 0
                    continue
                except RecursionError:
                    raise TraceError(f"item {n} is nested too deeply", file=str(path)) from None
                except ValueError as e:  # an integer past Python's int_max_str_digits (4300 digits)
                    raise TraceError(f"invalid JSON in item {n}: {str(e).split(';')[0]}", file=str(path)) from None
                yield item
                n += 1
        except UnicodeDecodeError as e:
            raise TraceError(f"not UTF-8 text: {e}", file=str(path)) from None


def _counter(path: str | None):
    if not path:
        return lambda s: max(1, -(-len(s.encode("utf-8")) // 4)), {"kind": "estimate", "rule": "ceil(utf8_bytes / 4)"}
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TraceError("--tokenizer needs the `tokenizers` package (pip install tokenizers)") from None
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - any load failure is a bad tokenizer file
        raise TraceError(f"cannot load tokenizer: {e}", file=path) from None
    return (lambda s: max(1, len(tok.encode(s, add_special_tokens=False).ids))), {"kind": "tokenizers", "file": Path(path).name}


def read(src: Path, opts: argparse.Namespace, meta: dict[str, Any]) -> Iterator[pa.Table]:
    count, tok_meta = _counter(opts.tokenizer)
    rate = 1.0 if opts.rate is None and opts.arrivals is None else opts.rate
    arrivals = SynthArrivals(arrival_process(argparse.Namespace(**{**vars(opts), "rate": rate})), meta)
    meta.update(tokenizer=tok_meta)
    rows, conv = [], 0
    for item in iter_json_items(src):
        if opts.limit is not None and conv >= opts.limit:
            break
        if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
            raise TraceError(f"conversation {conv}: expected an object with a 'conversations' list", file=str(src))
        cid = str(item.get("id", conv))
        rest = {k: v for k, v in item.items() if k not in ("id", "conversations")}
        msgs = [m for m in item["conversations"] if isinstance(m, dict) and isinstance(m.get("value"), str)]
        turn = 0
        for i, m in enumerate(msgs):
            if m.get("from") not in USER:
                continue
            reply = msgs[i + 1] if i + 1 < len(msgs) and msgs[i + 1].get("from") in ASSISTANT else None
            rows.append({"request_id": f"{cid}:{turn}", "session_id": cid, "turn": turn,
                         "parent_id": f"{cid}:{turn - 1}" if turn else None, "prompt": m["value"],
                         "input_tokens": count(m["value"]), "output_tokens": count(reply["value"]) if reply else None,
                         "extra": json.dumps(rest, ensure_ascii=False) if rest else None})
            turn += 1
        conv += 1
        if len(rows) >= 20_000:
            yield pa.Table.from_pylist(rows).append_column("arrival_ns", arrivals(len(rows)))
            rows = []
    if rows:
        yield pa.Table.from_pylist(rows).append_column("arrival_ns", arrivals(len(rows)))
    meta["source"]["conversations"] = conv
