"""Repeated looks at a growing run (`replay run --until-decided`, docs/verdicts.md#run-until-decided).

A gate that looks after every batch of requests and stops at the first verdict would, at 95 % per
look, be wrong far more often than 5 % over the run. The looks here come at doubling row counts
(16, 32, 64, ...) and look k judges at confidence 1 - (1 - c) * 6 / (pi^2 k^2): the error rates
spent over all looks sum to at most 1 - c (sum 1/k^2 = pi^2/6), whatever the dependence between
looks (a union bound), so a run stopped at its first decided look keeps the false pass and false
fail rates of one look at c. Chosen over an always-valid test (a confidence sequence) because it
reuses the gate's exact bounds unchanged, needs no tuning, and costs little: doubling looks make
the count of looks logarithmic in the run length (10 looks by 8,192 rows).
"""
from __future__ import annotations

import math

FIRST_LOOK = 16        # rows at the first look; each later look doubles it


def look_rows(k: int) -> int:
    """The rows judged at look k (1-based)."""
    return FIRST_LOOK << (k - 1)


def look_confidence(confidence: float, k: int) -> float:
    """The confidence of look k such that the looks' error rates sum to at most 1 - confidence."""
    return 1.0 - (1.0 - confidence) * 6.0 / (math.pi ** 2 * k * k)


def looks_for(rows: int) -> int:
    """How many looks a run of `rows` rows gets: every doubling size it reaches, then one at its end
    when that is not itself a look."""
    k = max(rows // FIRST_LOOK, 0).bit_length()    # the last k with look_rows(k) <= rows
    return k + (rows != look_rows(k) if k else 1)


def judged(config: dict | None) -> tuple[float, int] | None:
    """A run until decided (run.json `until_decided`): the scheduled-time bound of the rows its last
    look judged and that look's number; None for any other run."""
    u = (config or {}).get("until_decided") or {}
    if u.get("judged_until_s") is None or not u.get("look"):
        return None
    return float(u["judged_until_s"]), int(u["look"])
