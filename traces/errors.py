"""Actionable trace errors: which file, which column, which rows, which rule."""
from __future__ import annotations

import re
from collections.abc import Sequence

MAX_RULE_CHARS = 600   # a rule quoting a 5,000-digit number or a binary line is cut in the middle
_UNPRINTABLE = re.compile(r"[^\S ]|[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str, limit: int = MAX_RULE_CHARS) -> str:
    """`text` on one line for a terminal: control characters, other line breaks and undecodable
    bytes (surrogates) as repr-style escapes (`\\x1b`, `\\n`), and at most about `limit`
    characters (the middle cut, saying how much)."""
    text = _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], str(text))
    if len(text) > limit:
        head, tail = limit * 2 // 3, limit // 6
        text = f"{text[:head]} ...[{len(text) - head - tail:,} characters cut]... {text[-tail:]}"
    return text


class TraceError(ValueError):
    """Invalid trace input. The CLI prints `str(err)` and exits 2; never a traceback."""

    exit_code = 2

    def __init__(self, rule: str, *, file: str | None = None, column: str | None = None,
                 rows: Sequence[int] | None = None, total_rows: int | None = None) -> None:
        self.rule, self.file, self.column, self.total_rows = rule, file, column, total_rows
        self.rows = list(rows) if rows is not None else None
        super().__init__(self._format())

    def _format(self) -> str:
        msg = printable(self.rule)
        if self.rows is not None:
            more = f" and {len(self.rows) - 10} more" if len(self.rows) > 10 else ""
            of = f" (of {self.total_rows} rows)" if self.total_rows is not None else ""
            msg += f": rows {', '.join(map(str, self.rows[:10]))}{more}{of}"
        where = [printable(str(self.file), 300) if self.file else "", f"column {self.column!r}" if self.column else ""]
        return ": ".join([*filter(None, where), msg])
