#!/usr/bin/env python3
"""A forced tool round trip on a gpt-oss model through the official `openai`
client (crates/onebit/tests/serve_harmony.rs starts the server on the
gpt-oss fixture with gpt-oss's vocabulary and template, random output
matrices): under tool_choice "required" the reply is one call to the
declared function with arguments its schema allows, finish_reason
"tool_calls", whole and streamed the same; no harmony markup reaches the
client; the call and its result go back and the model answers.

The weather tool's city is an enum: a random-weight model under a string
schema might never close its string.

Usage: python3 tests/serve/test_harmony_tools.py http://127.0.0.1:PORT
Prints "N passed, M failed"; exits 1 on any failure.
"""
import json
import sys

import openai

import runner  # tests/serve/runner.py, beside this script

BASE = sys.argv[1].rstrip("/")
client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MARKUP = ["<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>", "to=functions"]
state = {}


def no_markup(text):
    for m in MARKUP:
        assert m not in (text or ""), f"harmony markup {m!r} reached the client: {text!r}"


def test_a_required_call_is_one_parsed_call():
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    calls = c.message.tool_calls
    assert calls and len(calls) == 1, c.message
    assert calls[0].function.name == "get_weather", calls[0]
    args = json.loads(calls[0].function.arguments)
    assert set(args) == {"city"} and args["city"] in ("Paris", "Berlin"), args
    no_markup(c.message.content)
    state["call"] = calls[0]


def test_streamed_the_same_call():
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0,
        stream=True,
    )
    name, args, finish, content = "", "", None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", finish
    assert name == state["call"].function.name, name
    assert json.loads(args) == json.loads(state["call"].function.arguments), args
    no_markup(content)


def test_the_result_goes_back_and_is_answered():
    call = state["call"]
    messages = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear", "celsius": 21})},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls"), c
    assert r.usage.prompt_tokens > 0
    no_markup(c.message.content)
    # The template rendered the call and its result into the prompt: it is
    # longer than the question alone by at least the result's tokens.
    alone = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > alone.usage.prompt_tokens + 10, (r.usage, alone.usage)


runner.run(globals())
