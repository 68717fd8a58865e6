"""engine-stub's reasoning and tool-call answers: the delta shapes (unit), then a real engine
subprocess read with the openai SDK and replayed with `replay run`."""
from __future__ import annotations

import json
from types import SimpleNamespace

import openai
import pytest

from llm_replay.engine_stub.answer import AnswerOptions, ChoiceDeltas, parse_reasoning, plan
from tests.conftest import run_cli, start_engine
from tests.replay.runkit import records, run_info, write_trace

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string"}, "city": {"type": "string"}}, "required": ["city"]}}}]


def req(reasoning_tokens=None, **extra):
    return SimpleNamespace(model_extra=extra, reasoning_tokens=reasoning_tokens)


@pytest.mark.parametrize("spec,want", [("0.3", 0.3), ("30%", 0.3), ("20", 20), ("0", 0), (None, None)])
def test_reasoning_spec(spec, want):
    assert parse_reasoning(spec) == want


@pytest.mark.parametrize("spec", ["1.5", "-2", "lots", "120%"])
def test_bad_reasoning_spec(spec):
    with pytest.raises(ValueError, match="--reasoning"):
        parse_reasoning(spec)


def test_plan_share_count_request_field_and_thinking_off():
    assert plan(AnswerOptions(0.25), req(), 40).reasoning == 10
    assert plan(AnswerOptions(7), req(), 40).reasoning == 7
    assert plan(AnswerOptions(7), req(reasoning_tokens=3), 40).reasoning == 3
    assert plan(AnswerOptions(), req(reasoning_tokens=3), 40) == plan(AnswerOptions(3), req(), 40)
    off = plan(AnswerOptions(7), req(chat_template_kwargs={"enable_thinking": False}), 40)
    assert off.reasoning == 0 and off.report          # usage still says 0 reasoning tokens
    assert not plan(AnswerOptions(), req(), 40).report


def test_plan_tools():
    assert plan(AnswerOptions(), req(tools=TOOLS), 9).tool is None              # auto, no --tool-calls
    p = plan(AnswerOptions(tool_calls=True), req(tools=TOOLS), 9)
    assert (p.tool, p.param) == ("get_weather", "city")
    assert plan(AnswerOptions(), req(tools=TOOLS, tool_choice="required"), 9).tool == "get_weather"
    assert plan(AnswerOptions(tool_calls=True), req(tools=TOOLS, tool_choice="none"), 9).tool is None


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "both"])
def test_deltas_reasoning_then_tool_call_arguments_are_json(field):
    c = ChoiceDeltas(plan(AnswerOptions(2, field), req(tools=TOOLS, tool_choice="required"), 6))
    texts = [" a", " b", "NAME", ' say "hi"', " x", " y"]
    deltas = [json.loads(c.delta(t, k + 1, k == 5)) for k, t in enumerate(texts)]
    keys = ["reasoning", "reasoning_content"] if field == "both" else [field]
    assert all(set(d) == set(keys) and d[keys[0]] == texts[k] for k, d in enumerate(deltas[:2]))
    call = deltas[2]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather"} and call["type"] == "function" and call["index"] == 0
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[3:])
    assert json.loads(args) == {"city": ' say "hi" x y'}
    assert c.finish_reason("length") == "tool_calls" and c.reasoning_tokens(6) == 2
    assert json.loads(c.message()["tool_calls"][0]["function"]["arguments"]) == {"city": ' say "hi" x y'}


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("torch")
    eng = start_engine("--reasoning", "8", "--tool-calls")
    yield eng.url
    eng.stop()


def chat_stream(url, **kw):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    return list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                               stream=True, stream_options={"include_usage": True}, **kw))


def test_engine_streams_reasoning_then_answer(engine):
    chunks = chat_stream(engine, max_tokens=12, extra_body={"ignore_eos": True})
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    kinds = ["r" if getattr(d, "reasoning_content", None) else "a" if d.content else "-" for d in deltas]
    assert "".join(kinds).strip("-") == "r" * 8 + "a" * 4
    usage = chunks[-1].usage
    assert usage.completion_tokens == 12 and usage.completion_tokens_details.reasoning_tokens == 8
    off = chat_stream(engine, max_tokens=6, extra_body={"ignore_eos": True, "reasoning_tokens": 0})
    assert not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in off if c.choices)
    with pytest.raises(openai.BadRequestError, match="reasoning_tokens"):
        chat_stream(engine, max_tokens=6, extra_body={"reasoning_tokens": -1})


def test_engine_streams_a_tool_call(engine):
    chunks = chat_stream(engine, max_tokens=10, tools=TOOLS, extra_body={"ignore_eos": True, "reasoning_tokens": 2})
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("chatcmpl-tool-")
    assert len(calls) == 8                        # the name, then one piece of arguments per token
    assert set(json.loads("".join(tc.function.arguments or "" for tc in calls))) == {"city"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_replay_run_and_check_against_the_engine(engine, tmp_path):
    p = run_cli("replay", "check", "--target", engine, "--json")
    caps = json.loads(p.stdout)
    assert caps["reasoning_stream"] and caps["reasoning_field"] == "reasoning_content"
    assert caps["tool_calls_stream"] and caps["reasoning_tokens_in_usage"]
    trace = write_trace(tmp_path / "t.parquet", 8, gap_s=0.05, output_tokens=12)
    out = tmp_path / "run"
    p = run_cli("replay", "run", "--trace", trace, "--target", engine, "--api", "chat", "-o", out, "--no-progress",
                timeout=120)
    assert p.returncode == 0, p.stderr
    df = records(out)
    assert (df.status == "ok").all() and (df.completion_tokens == 12).all()
    assert (df.reasoning_tokens == 8).all() and (df.reasoning_chunks == 8).all()
    assert (df.first_answer_s >= df.first_token_s).all() and (df.token_times.map(len) == 12).all()
    assert "ttfa_ms" in p.stdout and run_info(out)["capabilities"]["reasoning_stream"]
