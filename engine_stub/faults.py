"""Seeded fault injection, for testing load generators and SLO gates (all off by default).

Each request draws its faults once, in arrival order, from one seeded RNG: HTTP 500, HTTP 429,
and for streams a stall, a dropped connection or one malformed SSE event, all at the stream's
midpoint (after max(1, max_tokens // 2) content events).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .config import check_range


@dataclass
class FaultConfig:
    error_rate: float = 0.0
    reject_rate: float = 0.0
    stall_ms: float = 0.0
    stall_rate: float = 1.0
    drop_rate: float = 0.0
    malformed_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_range(self, "fault-", "error_rate reject_rate stall_rate drop_rate malformed_rate", 0, 1)
        check_range(self, "fault-", "stall_ms", 0)


@dataclass
class RequestFaults:
    error: bool = False
    reject: bool = False
    stall_s: float = 0.0
    drop: bool = False
    malformed: bool = False


class DroppedConnection(Exception):
    """Raised inside a stream to make the server close the connection mid-response."""


class Faults:
    def __init__(self, cfg: FaultConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.enabled = any((cfg.error_rate, cfg.reject_rate, cfg.stall_ms, cfg.drop_rate, cfg.malformed_rate))

    def draw(self) -> RequestFaults:
        if not self.enabled:
            return _NONE
        c, r = self.cfg, self.rng.random
        # draw every fault for every request so one flag's draws never shift another's
        error, reject, stall, drop, bad = r() < c.error_rate, r() < c.reject_rate, r() < c.stall_rate, \
            r() < c.drop_rate, r() < c.malformed_rate
        return RequestFaults(error, reject and not error, c.stall_ms / 1e3 if stall else 0.0, drop, bad)


_NONE = RequestFaults()
