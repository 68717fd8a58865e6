"""Agentic task graphs at replay time: which rows wait for which, and what a dependant sends.

A row with `depends_on` is released when the last of its dependencies completes, `delay_s`
later (tool or think time; `--max-delay` caps it); a root keeps its trace time. A dependant
of a failed, cancelled or unsent row is not sent: it is recorded `dependency_failed`, and so
are its own dependants. Dependencies outside the replay window count as done.

Chat prompts carry the task's real conversation: a dependant whose input_tokens exceed its
conversation's context (prompt + reply of its session's previous call in the task, else of its
first dependency), and whose hash_ids (if both have some) start with that call's, sends that
conversation, the other dependencies' replies (subagent results) and new text for the
difference; a smaller one starts a fresh context (a subagent). Conversations are linked lists
shared by the calls that extend them (no copy per step), and a finished row's state is dropped when its last dependant is released:
memory follows the tasks in flight, not the length of the replay.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import plan


class Context:
    """A conversation: the messages of one call (its new turn and reply) after its parent's."""

    __slots__ = ("parent", "msgs", "tokens")

    def __init__(self, parent: "Context | None", msgs: tuple, tokens: int) -> None:
        self.parent, self.msgs, self.tokens = parent, msgs, tokens

    def messages(self) -> list[dict]:
        parts, c = [], self
        while c is not None:
            parts.append(c.msgs)
            c = c.parent
        return [m for msgs in reversed(parts) for m in msgs]


@dataclass
class Node:
    """A completed row that rows still to be released wait for."""
    end: float                  # s from t0 when its response ended
    status: str
    context: Context | None
    reply_tokens: int
    left: int                   # its dependants not released yet
    hashes: list | None = None  # its prompt's prefix blocks (trace hash_ids)


def _results(others: list) -> tuple:
    """Other dependencies' replies (subagent results) as one user message, or nothing."""
    if not others:
        return ()
    return ({"role": "user", "content": "\n\n".join(n.context.msgs[-1]["content"] for n in others)},)


class Graph:
    def __init__(self, speed: float = 1.0, max_delay_s: float | None = None) -> None:
        self.speed, self.max_delay_s = speed, max_delay_s
        self.done: dict[str, Node] = {}
        self.open: dict[str, list[str]] = {}       # row with dependants, not completed -> rows waiting
        self.waiting: dict[str, list] = {}         # rid -> [row, dependencies not completed]
        self.bases: dict[str, tuple] = {}          # rid in flight -> (its base context, extra messages)

    def read(self, row: tuple):
        """A row read from the feed. Returns a release (see `release`) when it can be released
        now, else None (a root, or a dependant parked until its dependencies complete)."""
        rid = row[plan.RID]
        if row[plan.NDEP]:
            self.open[rid] = []
        deps = row[plan.DEPS]
        if not deps:
            return None
        missing = [d for d in deps if d in self.open]
        for d in missing:
            self.open[d].append(rid)
        if missing:
            self.waiting[rid] = [row, len(missing)]
            return None
        return self.release(row)

    def release(self, row: tuple):
        """("send", row with its due time as SCHED and its applied delay) or ("fail", row, why)."""
        conv = row[plan.CONV]
        nodes = [(d, node) for d in row[plan.DEPS] if (node := self._take(d)) is not None]
        base = self._take(conv) if conv is not None else None   # kept for this row apart from its deps
        bad = next(((d, n) for d, n in nodes if n.status != "ok"), None)
        if bad is not None:
            return "fail", row, f"dependency {bad[0]} ended {bad[1].status}"
        delay = min(row[plan.DELAY] or 0.0, self.max_delay_s if self.max_delay_s is not None else float("inf"))
        due = (max(n.end for _, n in nodes) + delay / self.speed) if nodes else row[plan.SCHED]
        row = row[:plan.SCHED] + (due,) + row[plan.SCHED + 1:plan.DELAY] + (delay,) + row[plan.DELAY + 1:]
        if base is None and nodes:
            base, nodes = nodes[0][1], nodes[1:]
        others = [n for d, n in nodes if d != conv and n.context is not None]
        if base is not None and base.context is not None:
            self.bases[row[plan.RID]] = (base, others)
        return "send", row

    def _take(self, rid: str) -> Node | None:
        """A completed row's node, for one of the rows kept waiting for it (dropped after the last)."""
        node = self.done.get(rid)
        if node is not None:
            node.left -= 1
            if node.left <= 0:
                del self.done[rid]
        return node

    def history(self, row: tuple) -> tuple[list | None, int | None]:
        """(chat history, tokens of the new user message) for a released dependant; (None, None):
        a fresh context of input_tokens."""
        base = self.bases.get(row[plan.RID])
        if base is None:
            return None, None
        first, others = base
        have = first.context.tokens + sum(n.reply_tokens for n in others)
        h, fh = row[plan.HASH], first.hashes
        if row[plan.IN] <= have or (h and fh and list(h[:len(fh)]) != list(fh)):
            # a fresh context: shorter than the conversation, or its prefix blocks are not the
            # conversation's (a subagent's first call)
            del self.bases[row[plan.RID]]
            return None, None
        return first.context.messages() + list(_results(others)), row[plan.IN] - have

    def completed(self, row: tuple, status: str, end_s: float, user_text: str | None,
                  reply: str | None, prompt_tokens: int | None, completion_tokens: int | None) -> list:
        """Record a finished (or failed, or unsent) row; returns the releases it causes."""
        rid = row[plan.RID]
        base = self.bases.pop(rid, None)
        waiters = self.open.pop(rid, None)
        if waiters is None:
            return []
        ctx = None
        if status == "ok" and user_text is not None:
            parent, msgs = (base[0].context, _results(base[1])) if base is not None else (None, ())
            tokens = (prompt_tokens or row[plan.IN]) + (completion_tokens or 0)
            ctx = Context(parent, msgs + ({"role": "user", "content": user_text},
                                          {"role": "assistant", "content": reply or ""}), tokens)
        self.done[rid] = Node(end_s, status, ctx, completion_tokens or 0, row[plan.NDEP], row[plan.HASH])
        out = []
        for w in waiters:
            wait = self.waiting.get(w)
            if wait is not None:
                wait[1] -= 1
                if wait[1] == 0:
                    del self.waiting[w]
                    out.append(self.release(wait[0]))
        return out

    def parked(self) -> list[tuple]:
        """Rows still waiting at the end of the run (recorded not_sent)."""
        rows = [w[0] for w in self.waiting.values()]
        self.waiting.clear()
        return rows

    def __len__(self) -> int:
        return len(self.done) + len(self.open) + len(self.waiting)
