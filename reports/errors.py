"""Actionable errors for bad report input (records, run dirs, SLO specs, other tools' files).

The CLI prints `str(err)` and exits with `exit_code` (2: cannot evaluate); never a traceback.
"""
from __future__ import annotations

from collections.abc import Sequence


class ReportError(ValueError):
    """Input that cannot be analysed: names the file, the field and the rule broken."""

    exit_code = 2

    def __init__(self, rule: str, *, file: object = None, field: str | None = None,
                 rows: Sequence[int] | None = None, total_rows: int | None = None) -> None:
        self.rule, self.file, self.field = rule, file, field
        where = [str(x) for x in (file, field and f"field {field!r}") if x]
        if rows is not None:
            more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
            of = f" (of {total_rows} rows)" if total_rows is not None else ""
            rule += f": rows {', '.join(map(str, rows[:10]))}{more}{of}"
        super().__init__(": ".join([*where, rule]))


class SloSpecError(ReportError):
    """An invalid SLO spec; `field` is the path inside the spec (e.g. objectives[2])."""
