"""Actionable trace errors: which file, which column, which rows, which rule."""
from __future__ import annotations

from collections.abc import Sequence


class TraceError(ValueError):
    """Invalid trace input. The CLI prints `str(err)` and exits 2; never a traceback."""

    exit_code = 2

    def __init__(self, rule: str, *, file: str | None = None, column: str | None = None,
                 rows: Sequence[int] | None = None, total_rows: int | None = None) -> None:
        self.rule, self.file, self.column = rule, file, column
        self.rows = list(rows) if rows is not None else None
        self.total_rows = total_rows
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.column:
            where.append(f"column {self.column!r}")
        msg = self.rule
        if self.rows is not None:
            shown = ", ".join(str(r) for r in self.rows[:10])
            more = f" and {len(self.rows) - 10} more" if len(self.rows) > 10 else ""
            of = f" (of {self.total_rows} rows)" if self.total_rows is not None else ""
            msg += f": rows {shown}{more}{of}"
        return (": ".join(where) + ": " + msg) if where else msg
