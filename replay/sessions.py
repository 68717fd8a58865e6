"""Multi-turn sessions: chat history per session, and closed-loop turn gating.

`--sessions timestamps`: every turn is sent at its trace time, carrying the history of
the turns that have completed by then. `--sessions closed`: turn k+1 is sent when turn k
has completed plus the think time (the gap between the two turns' trace timestamps).

A trace's `input_tokens` of a later turn is taken as the whole prompt (history included)
when it is larger than the history, so the new user message gets the difference;
otherwise it is taken as the new message alone.
History is carried in chat messages (API `chat`); completions turns are independent prompts.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from . import plan

MAX_SESSIONS = 100_000  # state kept for at most this many recent sessions


@dataclass
class SessionState:
    history: list = field(default_factory=list)   # chat messages of completed turns
    history_tokens: int = 0
    busy: bool = False                            # a turn is in flight (closed mode)
    pending: deque = field(default_factory=deque) # closed mode: turns waiting for the previous one
    last_sched: float | None = None               # trace schedule of the last dispatched turn


class Sessions:
    def __init__(self, mode: str) -> None:
        self.closed = mode == "closed"
        self.state: OrderedDict[str, SessionState] = OrderedDict()

    def get(self, sid: str) -> SessionState:
        st = self.state.get(sid)
        if st is None:
            st = self.state[sid] = SessionState()
            old = next(iter(self.state.values()))
            if len(self.state) > MAX_SESSIONS and not old.busy and not old.pending:
                self.state.popitem(last=False)  # never drop a session with parked turns
        else:
            self.state.move_to_end(sid)
        return st

    def admit(self, row: tuple) -> bool:
        """Closed mode: True when the row may be scheduled now; else it is parked until
        the session's turn in flight completes."""
        if not self.closed or row[plan.SESSION] is None:
            return True
        st = self.get(row[plan.SESSION])
        if st.busy:
            st.pending.append(row)
            return False
        st.busy, st.last_sched = True, row[plan.SCHED]
        return True

    def context(self, row: tuple) -> tuple[list, int]:
        """(history messages, tokens for the new user message)."""
        st, n = self.get(row[plan.SESSION]), row[plan.IN]
        return list(st.history), n - st.history_tokens if 0 < st.history_tokens < n else n

    def completed(self, row: tuple, user_text: str | None, reply: str | None, ok: bool,
                  prompt_tokens: int | None, completion_tokens: int | None,
                  now_s: float) -> tuple[tuple, float] | None:
        """Record a finished turn; in closed mode return (next row, due time in s from t0)."""
        st = self.get(row[plan.SESSION])
        if ok and user_text is not None:
            st.history += [{"role": "user", "content": user_text},
                           {"role": "assistant", "content": reply or ""}]
            st.history_tokens = (prompt_tokens or row[plan.IN]) + (completion_tokens or 0)
        if not self.closed or not st.pending:
            st.busy = False   # (never set but in closed mode)
            return None
        nxt = st.pending.popleft()
        due = now_s + max(0.0, nxt[plan.SCHED] - (st.last_sched or nxt[plan.SCHED]))   # + the think time
        st.last_sched = nxt[plan.SCHED]
        return nxt[:plan.SCHED] + (due,) + nxt[plan.SCHED + 1:], due

    def parked(self) -> list[tuple]:
        """Rows still waiting for their previous turn (recorded not_sent at the end)."""
        out = []
        for st in self.state.values():
            out += st.pending
            st.pending.clear()
        return out
