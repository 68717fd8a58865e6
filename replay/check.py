"""`replay check --target URL`: what does this OpenAI-compatible server support?

Probes with the official `openai` SDK: the model list, chat and completions (plain and
streaming), usage in the stream, token-id prompts, `min_tokens` + `ignore_eos`, whether a chat
request's `reasoning_tokens` (engine-stub's field) sets its reasoning, whether the chat
stream carries reasoning (`delta.reasoning_content` or `delta.reasoning`) and whether it streams
tool calls. `replay run` calls `probe` to choose its defaults (prompt mode, forced output length)
and to refuse an API the target does not stream.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

PROBES = ("list_models", "chat", "chat_stream", "usage_in_stream", "reasoning_stream", "tool_calls_stream",
          "completions", "completions_stream", "token_id_prompts", "min_tokens_ignore_eos", "reasoning_tokens_request")
REASONING_FIELDS = ("reasoning_content", "reasoning")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _probe_in_child(target: str, api_key: str | None, model: str | None, timeout: float, headers: dict | None) -> dict:
    """The probe from a process that gevent has patched (the locustfile under Locust's CLI): the SDK's
    HTTP stack imports trio, which needs the `select.epoll` that gevent removes, so it runs in a
    plain child. The key travels on stdin, never in the argument list."""
    code = "import json, sys; from llm_replay.replay.check import probe; print(json.dumps(probe(*json.load(sys.stdin))))"
    p = subprocess.run([sys.executable, "-c", code], input=json.dumps([target, api_key, model, timeout, headers]),
                       capture_output=True, text=True, timeout=30 * timeout)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"errors": {"list_models": f"probe process failed: {last}"[:200]}, "models": [],
                **dict.fromkeys(PROBES, False)}
    return json.loads(p.stdout)


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="probe what an OpenAI-compatible target supports",
                       description="Probe a target with the official openai SDK and print what it supports.")
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    p.add_argument("--model", help="model to probe (default: the first served model)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=main)


def probe(target: str, api_key: str | None = None, model: str | None = None,
          timeout: float = 20.0, headers: dict | None = None) -> dict:
    """Capabilities of `target`: each probe True/False, `models`, and `errors` per failed probe.
    `headers` go with every probe request (`replay run --otlp`: the run's probe traceparent)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("select"):
        return _probe_in_child(target, api_key, model, timeout, headers)
    import openai
    client = openai.OpenAI(base_url=target.rstrip("/").removesuffix("/v1") + "/v1", api_key=api_key or "none",
                           timeout=openai.Timeout(timeout, connect=min(timeout, 5.0)), max_retries=0,
                           default_headers=headers)
    out: dict = {"errors": {}}

    def attempt(name, fn):
        try:
            out[name] = bool(fn())
        except Exception as e:  # noqa: BLE001 - every failure is an answer: "not supported"
            out[name] = False
            out["errors"][name] = f"{type(e).__name__}: {e}"[:200]
            return e

    served, lens = [], {}   # the model ids, and {id: max_model_len} where listed

    def list_models():
        for m in client.models.list().data:
            served.append(m.id)
            if isinstance(getattr(m, "max_model_len", None), int):   # vLLM, SGLang, engine-stub
                lens[m.id] = m.max_model_len
        return served
    err = attempt("list_models", list_models)
    out["models"], out["max_model_len"] = served, lens
    # Not even a connection (refused, no route, DNS, connect timeout): every other probe would
    # fail the same way, each after its own wait (a host that is down: ~4 s apiece).
    cause = getattr(err, "__cause__", None)
    if isinstance(err, openai.APIConnectionError) and type(cause).__name__ in ("ConnectError", "ConnectTimeout"):
        reason = out["unreachable"] = f"cannot connect: {str(cause) or 'connect timed out'}"[:200]
        out["errors"] = dict.fromkeys(PROBES, reason)
        out.update(dict.fromkeys(PROBES, False), model=model)
        return out
    model = model or (served[0] if served else "default")
    out["model"] = model
    msgs = [{"role": "user", "content": "Say hello."}]
    attempt("chat", lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=4).choices)

    def chat_stream():
        chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=16, stream=True,
                                                     stream_options={"include_usage": True}))
        usage = next((c.usage for c in chunks if getattr(c, "usage", None)), None)
        out["usage_in_stream"] = usage is not None
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        fields = [f for f in REASONING_FIELDS if any(getattr(d, f, None) for d in deltas)]
        out["reasoning_stream"] = bool(fields)
        out["reasoning_field"] = fields[0] if fields else None
        details = getattr(usage, "completion_tokens_details", None)
        rt = getattr(details, "reasoning_tokens", None)
        rt = rt if rt is not None else (usage.model_extra or {}).get("reasoning_tokens") if usage is not None else None
        # a count that stays 0 while reasoning streams is not a count (SGLang on some paths)
        out["reasoning_tokens_in_usage"] = rt is not None and (bool(rt) or not fields)
        out["reasoning_tokens_reported"] = rt
        return any(d.content or d.tool_calls for d in deltas) or bool(fields)
    attempt("chat_stream", chat_stream)

    def tool_calls_stream():
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=TOOLS, tool_choice="required", max_tokens=64, stream=True))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
        out["tool_call_chunks"] = len(calls)
        return bool(calls)
    attempt("tool_calls_stream", tool_calls_stream)
    attempt("completions", lambda: client.completions.create(model=model, prompt="Hello", max_tokens=4).choices)
    attempt("completions_stream", lambda: any(c.choices and c.choices[0].text for c in client.completions.create(
        model=model, prompt="Hello", max_tokens=4, stream=True)))
    attempt("token_id_prompts", lambda: client.completions.create(
        model=model, prompt=[1000, 1001, 1002, 1003], max_tokens=2).usage.prompt_tokens == 4)

    def forced():
        r = client.completions.create(model=model, prompt=[1000, 1001, 1002], max_tokens=12,
                                      extra_body={"min_tokens": 12, "ignore_eos": True})
        return r.usage is not None and r.usage.completion_tokens == 12
    attempt("min_tokens_ignore_eos", forced)

    def asked_reasoning():  # engine-stub's request field; a real server decides how long it reasons
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, extra_body={
            "min_tokens": 8, "ignore_eos": True, "reasoning_tokens": 3})
        return getattr(getattr(r.usage, "completion_tokens_details", None), "reasoning_tokens", None) == 3
    attempt("reasoning_tokens_request", asked_reasoning)
    for key in ("usage_in_stream", "reasoning_stream", "reasoning_tokens_in_usage"):
        out.setdefault(key, False)
    return out


class CheckError(RuntimeError):
    exit_code = 2


def main(args) -> int:
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    caps = probe(args.target, key, args.model)
    if caps.get("unreachable"):
        raise CheckError(f"target {args.target}: {caps['unreachable']}")
    if args.json:
        print(json.dumps(caps, indent=2))
        return 0 if caps["list_models"] or caps["chat"] or caps["completions"] else 1
    print(f"target {args.target}  model {caps['model']}  served: {', '.join(caps['models']) or '-'}")
    for name in PROBES:
        print(f"  {name:24s} {'yes' if caps.get(name) else 'no ':3s}  {caps['errors'].get(name, '')}")
    if caps.get("reasoning_stream"):
        print(f"reasoning: streamed in delta.{caps['reasoning_field']}; reasoning_tokens in usage: "
              f"{'yes' if caps.get('reasoning_tokens_in_usage') else 'no, it reports 0 (replay counts reasoning chunks)' if caps.get('reasoning_tokens_reported') == 0 else 'no (replay counts reasoning chunks)'}")
    force = "on" if caps.get("min_tokens_ignore_eos") else "off"
    print(f"replay run defaults: --prompt-mode {'ids' if caps.get('token_id_prompts') else 'text'}, force output length {force}")
    return 0 if caps["list_models"] or caps["chat"] or caps["completions"] else 1
