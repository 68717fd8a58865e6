"""Agentic task graphs in the generator (`agent` spec section, traces.agents), the `agentic`
preset, and fit / compare / describe on graphs."""
import copy

import numpy as np
import pyarrow.compute as pc
import pytest

from tests.conftest import run_cli
from llm_replay.traces import stats
from llm_replay.traces.compare import compare_traces
from llm_replay.traces.describe import describe_file
from llm_replay.traces.fit import fit_trace
from llm_replay.traces.generate import generate, generate_to
from llm_replay.traces.sampling import discrete_mean, sample_from_normal
from llm_replay.traces.presets import CONTEXT, preset_spec
from llm_replay.traces.spec import SpecError, parse_spec
from llm_replay.traces.spec_fields import _Reader, parse_dist
from llm_replay.traces.trace import Trace
from llm_replay.traces.validate import validate_file


def dist_from_dict(d: dict):  # a validated distribution from its spec dict
    return parse_dist(_Reader(d, "dist", None))


AGENT = {"steps": {"dist": "uniform", "low": 5, "high": 15},                 # mean 10
         "tool_delay_s": {"dist": "lognormal", "median": 2.0, "sigma": 0.8, "min": 0, "max": 120},
         "growth": {"dist": "lognormal", "median": 100, "sigma": 0.8, "min": 0, "max": 2000},
         "fanout": {"p": 0.3, "width": {"dist": "uniform", "low": 2, "high": 4}},   # width mean 3
         "system_blocks": 8, "tools_blocks": 4}
SPEC = {"duration": 3600, "seed": 1, "block_size": 16, "clients": [
    {"name": "coder", "rate": 5.0, "agent": AGENT,
     "input": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 2000},
     "output": {"dist": "lognormal", "median": 120, "sigma": 0.7, "max": 1000}}]}


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    path = tmp_path_factory.mktemp("agentic") / "known.parquet"
    generate_to(SPEC, path, seed=1)
    return path, Trace.read(path)


def test_preset_generates_a_valid_graph_within_the_context(tmp_path):
    path = tmp_path / "agentic.parquet"
    n, _ = generate_to(preset_spec("agentic"), path, seed=3)
    info = validate_file(path)  # order, unique ids, dependencies earlier rows of the same task
    assert info["rows"] == n and {"task_id", "depends_on", "delay_s"} <= set(info["columns"])
    t = Trace.read(path).table
    assert abs(n / 600 - 3) < 0.5
    inp, out = t.column("input_tokens").to_numpy(), t.column("output_tokens").to_numpy()
    assert (inp + out).max() <= CONTEXT and ((inp + out) == CONTEXT).mean() < 0.2
    deps, delay = t.column("depends_on"), t.column("delay_s")
    roots = deps.is_null().to_numpy(zero_copy_only=False)
    assert np.array_equal(roots, delay.is_null().to_numpy(zero_copy_only=False))  # delay only on dependants
    assert 0.02 < roots.mean() < 0.1 and t.column("task_id").null_count == 0
    # every call starts with the shared 160-block system + tools prefix; a step extends its
    # predecessor's prompt, so its predecessor's full blocks are its own first blocks
    ids = {r: h for r, h in zip(t.column("request_id").to_pylist(), t.column("hash_ids").to_pylist())}
    shared = ids[t.column("request_id")[0].as_py()][:160]
    assert len(set(shared)) == 160 and all(h[:160] == shared for h in ids.values())
    rows = t.column("request_id").to_pylist()
    subagents = {x for d in deps.to_pylist() if d for x in d[1:]}            # joined after the first dependency
    steps = [(r, d[0]) for r, d in zip(rows, deps.to_pylist()) if d and r not in subagents and d[0] not in subagents]
    assert len(steps) > 1000 and subagents
    assert all(ids[r][:len(ids[p]) - 1] == ids[p][:-1] for r, p in steps if len(ids[r]) >= len(ids[p]))
    assert sum(len(ids[r]) < len(ids[p]) for r, p in steps) < 0.2 * len(steps)  # (histories cut at the context)
    a = t.column("arrival_ns").to_numpy()
    where = {r: i for i, r in enumerate(rows)}
    assert all(a[where[r]] > a[where[p]] for r, p in steps)  # dependants after their dependencies


def test_generated_graph_matches_the_spec(known):
    _, t = known
    g = stats.agent_stats(t)
    assert g["tasks"] > 500
    assert g["steps"]["mean"] == pytest.approx(10, abs=0.5)                # se ~0.1
    assert g["fanout_share"] == pytest.approx(0.3, abs=0.025)             # se ~0.005
    assert g["fanout_width"]["mean"] == pytest.approx(3, abs=0.15)
    assert g["delay_s"]["p50"] == pytest.approx(2.0, rel=0.05)              # se ~1 %
    assert g["growth"]["p50"] == pytest.approx(100, rel=0.05)
    assert stats.mean_rate(t) == pytest.approx(5, rel=0.1)                  # rate counts every call
    joins = [d for d in t.table.column("depends_on").to_pylist() if d and len(d) > 1]
    assert joins and {len(d) - 1 for d in joins} == {2, 3, 4}


def test_deterministic_per_seed():
    spec = copy.deepcopy(SPEC)
    spec["duration"] = 300
    a, b, c = generate(spec, seed=4), generate(spec, seed=4), generate(spec, seed=5)
    assert a.table.equals(b.table) and not a.table.equals(c.table)
    tasks = pc.unique(a.table.column("task_id"))
    assert len(tasks) > 5 and all(x.startswith("coder-") for x in tasks.to_pylist())


def test_streamed_file_equals_the_in_memory_trace_beside_other_clients(tmp_path, monkeypatch):
    """Small row groups cut tasks apart; an agent client beside a session client and a plain one."""
    import llm_replay.traces.generate as gen_mod
    import llm_replay.traces.trace as trace_mod
    monkeypatch.setattr(gen_mod, "ROW_GROUP", 500)
    monkeypatch.setattr(trace_mod, "ROW_GROUP", 500)
    spec = copy.deepcopy(SPEC)
    spec.update(duration=400, timestamp_quantum_s=0.5)
    spec["clients"][0].update(models={"a": 0.5, "b": 0.5}, failures=0.05, slo_class={"x": 1, "y": 1})
    const = lambda v: {"dist": "constant", "value": v}  # noqa: E731
    spec["clients"] += [
        {"name": "chat", "rate": 2, "input": const(40), "output": const(4), "prefix": {"system_blocks": 1},
         "sessions": {"turns": {"dist": "uniform", "low": 1, "high": 4}, "think_s": const(5)}},
        {"name": "plain", "rate": 1, "input": const(10), "output": const(2)}]
    whole = generate(spec, seed=2)
    streamed, written = tmp_path / "s.parquet", tmp_path / "w.parquet"
    assert generate_to(spec, streamed, seed=2) == (whole.num_rows, 2)
    whole.write(written)
    assert streamed.read_bytes() == written.read_bytes()
    validate_file(streamed)
    t = whole.table
    client, task = t.column("client_id").to_pylist(), t.column("task_id").to_pylist()
    assert all((c == "coder") == (k is not None) for c, k in zip(client, task))
    assert t.column("parent_id").null_count < t.num_rows and t.column("depends_on").null_count < t.num_rows


def _median(d):
    return float(sample_from_normal(dist_from_dict(d), np.zeros(1))[0])


@pytest.mark.slow
def test_fit_recovers_the_agent_section(known):
    _, t = known
    spec = fit_trace(t)
    parse_spec(spec)
    c = spec["clients"][0]
    ag = c["agent"]
    assert "sessions" not in c and "prefix" not in c
    assert discrete_mean(dist_from_dict(ag["steps"])) == pytest.approx(10, abs=0.5)
    assert ag["fanout"]["p"] == pytest.approx(0.3, abs=0.025)
    assert discrete_mean(dist_from_dict(ag["fanout"]["width"])) == pytest.approx(3, abs=0.15)
    assert ag["tool_delay_s"]["dist"] == "lognormal" and ag["tool_delay_s"]["median"] == pytest.approx(2, rel=0.05)
    assert ag["tool_delay_s"]["sigma"] == pytest.approx(0.8, rel=0.05)
    assert _median(ag["growth"]) == pytest.approx(100, rel=0.05)
    assert ag["system_blocks"] + ag["tools_blocks"] == 12 and "context" not in ag
    assert _median(c["input"]) == pytest.approx(200, rel=0.1)               # the task's own request
    assert _median(ag["fanout"]["input"]) == pytest.approx(200, rel=0.1)    # subagents: the client's input
    assert c["arrival"]["process"] == "poisson"
    rows = compare_traces(t, generate(spec, seed=9))
    agent_rows = [r for r in rows if r["metric"].startswith("agent.")]
    assert len(agent_rows) == 7 and all(r["verdict"] == "pass" for r in agent_rows), agent_rows


@pytest.mark.slow
def test_compare_passes_another_seed_and_flags_doubled_delays(known):
    _, t = known
    other = generate(SPEC, seed=2)
    rows = compare_traces(t, other)
    assert all(r["verdict"] != "fail" for r in rows), [r for r in rows if r["verdict"] == "fail"]
    tb = other.table
    doubled = Trace(tb.set_column(tb.column_names.index("delay_s"), "delay_s", pc.multiply(tb.column("delay_s"), 2.0)))
    failed = {r["metric"] for r in compare_traces(t, doubled) if r["verdict"] == "fail"}
    assert failed == {"agent.delay_s.p50", "agent.delay_s.p90"}
    plain = Trace(tb.drop_columns(["task_id", "depends_on", "delay_s"]))
    lacks = [r for r in compare_traces(t, plain) if r["metric"].startswith("agent.")]
    assert lacks and all(r["verdict"] == "fail" and "B has no depends_on" in r["reason"] for r in lacks)


@pytest.mark.slow
def test_describe_prints_the_graph(known, tmp_path):
    path, _ = known
    text = describe_file(path)
    assert "agent tasks" in text and "fan-out share" in text and "delay_s        p50=" in text
    generate(preset_spec("chat", duration=60), seed=0).write(tmp_path / "chat.parquet")
    assert "agent tasks" not in describe_file(tmp_path / "chat.parquet")
    proc = run_cli("replay", "trace", "generate", "--preset", "agentic", "--duration", "120",
                   "-o", tmp_path / "a.parquet")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("replay", "trace", "validate", tmp_path / "a.parquet")
    assert proc.returncode == 0, proc.stderr


def _with_agent(path, value, client=None):
    spec = copy.deepcopy(SPEC)
    spec["clients"][0].update(client or {})
    d = spec["clients"][0]["agent"]
    *head, last = path
    for k in head:
        d = d[k]
    if value is None:
        del d[last]
    else:
        d[last] = value
    return spec


@pytest.mark.parametrize("path, value, needle", [
    (["depth"], 3, "clients[0].agent.depth: unknown field; allowed: context, fanout, growth"),
    (["steps"], None, "clients[0].agent.steps: is required for agent"),
    (["growth"], None, "clients[0].agent.growth: is required for agent"),
    (["steps", "min"], 0, "clients[0].agent.steps.min: a task has 1..10,000 steps"),
    (["tool_delay_s"], {"dist": "pareto"}, "clients[0].agent.tool_delay_s.dist: unknown dist 'pareto'"),
    (["fanout", "p"], 1.5, "clients[0].agent.fanout.p: must be <= 1, got 1.5"),
    (["fanout", "width"], None, "clients[0].agent.fanout.width: is required"),
    (["fanout", "width", "min"], 0, "clients[0].agent.fanout.width.min: a fan-out has 1..10,000 subagent calls"),
    (["fanout", "depth"], 2, "clients[0].agent.fanout.depth: unknown field"),
    (["system_blocks"], -1, "clients[0].agent.system_blocks: must be >= 0"),
    (["context"], 1.5, "clients[0].agent.context: must be a whole number"),
])
def test_bad_agent_keys_name_the_path(path, value, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(_with_agent(path, value))
    assert needle in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2


def test_agent_excludes_sessions_and_prefix():
    sessions = {"turns": {"dist": "constant", "value": 2}, "think_s": {"dist": "constant", "value": 1}}
    with pytest.raises(SpecError, match=r"^clients\[0\]\.agent: cannot be combined with sessions"):
        parse_spec(_with_agent(["context"], 4096, {"sessions": sessions}))
    with pytest.raises(SpecError, match=r"clients\[0\]\.agent: cannot be combined with prefix"):
        parse_spec(_with_agent(["context"], 4096, {"prefix": {"system_blocks": 2}}))
