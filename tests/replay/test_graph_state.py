"""replay.graph: what the runner keeps for a task graph is dropped as the graph completes (memory
follows the tasks in flight), and releases follow the rules (delay after the last end, cap,
failure cascade, fresh subagent contexts)."""
from __future__ import annotations

from llm_replay.replay import plan
from llm_replay.replay.graph import Graph


def row(rid, deps=None, delay=None, ndep=0, n_in=100, conv=None, sched=0.0, hashes=None):
    r = [None] * plan.ROW_LEN
    r[plan.RID], r[plan.SCHED], r[plan.IN], r[plan.OUT] = rid, sched, n_in, 10
    r[plan.TASK], r[plan.DEPS], r[plan.DELAY], r[plan.NDEP], r[plan.CONV] = "t", deps, delay, ndep, conv
    r[plan.HASH] = hashes
    return tuple(r)


def finish(g: Graph, r, end, status="ok"):
    return g.completed(r, status, end, f"text of {r[plan.RID]}", f"reply of {r[plan.RID]}", r[plan.IN], 10)


def test_chain_with_fan_out_leaves_no_state():
    g = Graph()
    a, b, c = row("a", ndep=3), row("b", ["a"], 0.5, ndep=1, n_in=40), row("c", ["a"], 0.5, ndep=1, n_in=40)
    j = row("j", ["a", "b", "c"], 1.0, n_in=400)
    assert g.read(a) is None
    assert g.read(b) is None and g.read(c) is None and g.read(j) is None
    rel = finish(g, a, 2.0)
    assert [(k, r[plan.RID], r[plan.SCHED]) for k, r in rel] == [("send", "b", 2.5), ("send", "c", 2.5)]
    for k, r in rel:
        assert g.history(r) == (None, None)           # 40 tokens < a's context: fresh subagent contexts
    assert finish(g, rel[0][1], 3.0) == []
    (kind, rj), = finish(g, rel[1][1], 3.2)
    assert kind == "send" and rj[plan.SCHED] == 4.2 and rj[plan.DELAY] == 1.0
    msgs, new = g.history(rj)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[2]["content"] == "reply of b\n\nreply of c"
    assert new == 400 - (110 + 10 + 10)
    finish(g, rj, 5.0)
    assert len(g) == 0 and not g.bases


def test_failure_cascades_and_cap():
    g = Graph(max_delay_s=0.2)
    a, b, c = row("a", ndep=1), row("b", ["a"], 9.0, ndep=1), row("c", ["b"], 3.0)
    for r in (a, b, c):
        g.read(r)
    (kind, rb, why), = finish(g, a, 1.0, status="timeout")
    assert kind == "fail" and why == "dependency a ended timeout"
    (kind, rc, why), = g.completed(rb, "dependency_failed", 1.0, None, None, None, None)
    assert kind == "fail" and why == "dependency b ended dependency_failed"
    g.completed(rc, "dependency_failed", 1.0, None, None, None, None)
    assert len(g) == 0 and not g.bases
    g2 = Graph(max_delay_s=0.2)
    g2.read(a)
    g2.read(b)
    (_, rb2), = finish(g2, a, 1.0)
    assert rb2[plan.SCHED] == 1.2 and rb2[plan.DELAY] == 0.2


def test_session_conversation_and_prefix_blocks():
    g = Graph()
    root = row("r", ndep=2, hashes=[1, 2])            # its subagent and its next call
    sub = row("s", ["r"], 0.0, ndep=1, n_in=500, hashes=[7, 8, 9])   # longer, but other blocks: fresh
    nxt = row("n", ["s"], 0.0, n_in=900, conv="r", hashes=[1, 2, 3])
    for r in (root, sub, nxt):
        g.read(r)
    (_, rs), = finish(g, root, 1.0)
    assert g.history(rs) == (None, None)
    (_, rn), = finish(g, rs, 2.0)
    msgs, _ = g.history(rn)                             # continues r's conversation, s's reply appended
    assert msgs[0]["content"] == "text of r" and msgs[-1]["content"] == "reply of s"
    finish(g, rn, 3.0)
    assert len(g) == 0 and not g.bases
