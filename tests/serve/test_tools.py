#!/usr/bin/env python3
"""Tool calls through the official `openai` client.

Usage: python3 tests/serve/test_tools.py URL_HERMES URL_PLAIN URL_GEMMA
URL_HERMES serves SmolLM2 with testdata/chat-templates/chatml-think-tools.jinja
(a Hermes-style template that knows tools); URL_PLAIN serves it with its own
template, which knows none (the generic fallback); URL_GEMMA with
testdata/chat-templates/functiongemma-tools.jinja (FunctionGemma's call syntax). crates/onebit/tests/serve.rs
starts both and runs this; scripts/python-deps.sh installs openai and
jsonschema. Prints "N passed, M failed"; exits 1 on any failure.
"""
import json
import sys

import jsonschema
import openai
import runner  # tests/serve/runner.py, beside this script

HERMES = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)
PLAIN = openai.OpenAI(base_url=sys.argv[2].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)
GEMMA = openai.OpenAI(base_url=sys.argv[3].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                      "parameters": TIME_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def ask(client, **kw):
    args = dict(model=client.models.list().data[0].id, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=80)
    args.update(kw)
    return client.chat.completions.create(**args)


def valid_calls(choice, names=("get_weather", "get_time"), finishes=("tool_calls",)):
    assert choice.finish_reason in finishes, choice
    calls = choice.message.tool_calls
    assert calls, choice.message
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_"), c
        assert c.function.name in names, c
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


def test_required_call_validates_and_the_answer_follows_the_tool_reply():
    r = ask(HERMES, tool_choice="required", parallel_tool_calls=False)
    calls = valid_calls(r.choices[0])
    assert len(calls) == 1 and calls[0].function.name == "get_weather", calls
    # The tool's reply goes back with the assistant turn as the client built it
    # (content None, arguments a JSON string).
    follow = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
    ] + [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature": 21, "unit": "celsius", "sky": "sunny"})}
         for c in calls]
    r2 = ask(HERMES, messages=follow, tool_choice="none", max_tokens=40)
    text = r2.choices[0].message.content
    assert r2.choices[0].finish_reason in ("stop", "length"), r2
    assert text and text.strip() and not r2.choices[0].message.tool_calls, r2.choices[0].message
    # The call and its result reached the prompt: it is longer than the question alone by more than
    # the result's ~20 tokens.
    base = ask(HERMES, tool_choice="none", max_tokens=1)
    assert r2.usage.prompt_tokens > base.usage.prompt_tokens + 20, (base.usage, r2.usage)
    print(f"        follow-up: {text!r}")


def test_streamed_deltas_reassemble_to_the_same_call():
    whole = valid_calls(ask(HERMES, tool_choice="required", parallel_tool_calls=False).choices[0])
    calls = {}
    finishes = []
    for chunk in ask(HERMES, tool_choice="required", parallel_tool_calls=False, stream=True):
        ch = chunk.choices[0]
        if ch.finish_reason:
            finishes.append(ch.finish_reason)
        for d in ch.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": "", "pieces": 0})
            if d.id:
                assert c["id"] is None, "the id comes once"
                c["id"], c["name"] = d.id, d.function.name
            c["arguments"] += d.function.arguments or ""
            c["pieces"] += 1
    assert finishes == ["tool_calls"], finishes
    got = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
    assert got == [(c.function.name, c.function.arguments) for c in whole], (got, whole)
    assert all(c["id"] and c["pieces"] >= 2 for c in calls.values()), calls
    # The arguments came as they were generated (about a fragment per token),
    # not cut into 16-byte pieces at the call's end.
    for c in calls.values():
        assert c["pieces"] - 1 > -(-len(c["arguments"]) // 16), c


def test_gemma_template_forced_call_and_round_trip():
    # A forced call under a FunctionGemma template is decoded in the JSON
    # envelope (no grammar for Gemma's syntax); the call then goes back
    # through the template in Gemma's syntax, with the tool's reply.
    r = ask(GEMMA, tool_choice="required", parallel_tool_calls=False)
    calls = valid_calls(r.choices[0])
    assert len(calls) == 1, calls
    follow = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "21 degrees and sunny"},
    ]
    r2 = ask(GEMMA, messages=follow, tool_choice="none", max_tokens=20)
    assert r2.choices[0].finish_reason in ("stop", "length"), r2
    base = ask(GEMMA, tool_choice="none", max_tokens=1)
    assert r2.usage.prompt_tokens > base.usage.prompt_tokens + 10, (base.usage, r2.usage)


def test_named_choice_calls_that_function():
    r = ask(HERMES, tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = valid_calls(r.choices[0], names=("get_time",))
    assert len(calls) == 1


def test_parallel_calls_are_each_valid():
    # Parallel calls are the default; this small model repeats its call
    # until max_tokens cuts it, and the whole calls before the cut are kept.
    r = ask(HERMES, tool_choice="required")
    calls = valid_calls(r.choices[0], finishes=("tool_calls", "length"))
    assert len(calls) >= 1, calls


def test_fallback_template_still_gives_a_valid_call():
    r = ask(PLAIN, tool_choice="required", parallel_tool_calls=False)
    calls = valid_calls(r.choices[0])
    follow = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "21 degrees and sunny"},
    ]
    r2 = ask(PLAIN, messages=follow, tool_choice="none", max_tokens=30)
    assert r2.choices[0].message.content, r2


def test_bad_tool_requests_are_400_naming_the_field():
    for kw, param in (
        (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools"),
        (dict(tools=None, tool_choice="required"), "tool_choice"),
        (dict(logit_bias={"5": 101}), "logit_bias"),
        (dict(logit_bias={"99999999": 1}), "logit_bias"),
    ):
        try:
            ask(HERMES, **kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body.get("param") == param, (kw, e.body)
        else:
            raise AssertionError(f"{kw} was accepted")


if __name__ == "__main__":
    runner.run(globals())
