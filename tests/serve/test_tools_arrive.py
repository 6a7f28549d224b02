#!/usr/bin/env python3
"""Tool calls that arrive (issue 29), on models that need the server's help.

Usage: python3 tests/serve/test_tools_arrive.py URL_QWEN URL_GEMMA
URL_QWEN serves Qwen2.5-Coder-0.5B-Instruct with its own template (Qwen2.5's
tool template, `<tool_call>` tags), which under `tool_choice: auto` writes its
calls as bare or fenced JSON instead: LangChain's bind_tools must still get
the call, whole and streamed (the server's lenient rule). URL_GEMMA serves
Gemma 3 270M (a template that knows no tools: the generic fallback), which
under `tool_choice: required` with parallel calls repeated one call until
max_tokens: the reply must end by itself, with calls. crates/onebit/tests/serve.rs
starts both and runs this; scripts/python-deps.sh installs langchain-openai,
openai and jsonschema. Prints "N passed, M failed"; exits 1 on any failure.
"""
import json
import sys

import jsonschema
import openai
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import runner  # tests/serve/runner.py, beside this script

QWEN = sys.argv[1].rstrip("/") + "/v1"
GEMMA = openai.OpenAI(base_url=sys.argv[2].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=600)


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny"


def qwen():
    model = openai.OpenAI(base_url=QWEN, api_key="x").models.list().data[0].id
    llm = ChatOpenAI(base_url=QWEN, api_key="x", model=model, temperature=0, max_retries=0, timeout=300)
    return llm.bind_tools([multiply, get_weather])


def test_bind_tools_under_auto_gets_the_call():
    # The numbers the call must carry are the question's.
    r = qwen().invoke("What is 12 times 34? Use the tool.")
    assert [(c["name"], c["args"]) for c in r.tool_calls] == [("multiply", {"a": 12, "b": 34})], r
    assert r.content == "" and r.response_metadata["finish_reason"] == "tool_calls", r
    print(f"        invoke: {r.tool_calls}")


def test_bind_tools_streamed_gets_the_same_call():
    chunks = list(qwen().stream("What is the weather in Paris?"))
    joined = chunks[0]
    for c in chunks[1:]:
        joined = joined + c
    assert [(c["name"], c["args"]) for c in joined.tool_calls] == [("get_weather", {"city": "Paris"})], joined
    # Held until decided: no piece of the JSON went out as text.
    assert joined.content == "", joined


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}},
        "required": ["timezone"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def test_required_parallel_calls_end_with_calls():
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": SCHEMAS[n]}}
             for n, d in (("get_weather", "Current weather in a city"), ("get_time", "Current time in a time zone"))]
    r = GEMMA.chat.completions.create(
        model=GEMMA.models.list().data[0].id, temperature=0, max_tokens=400, tools=tools,
        tool_choice="required", parallel_tool_calls=True,
        messages=[{"role": "user", "content": "What is the weather like in Paris and in London right now?"}])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    calls = ch.message.tool_calls
    # At least one call, at most the server's bound of eight; each valid.
    assert 1 <= len(calls) <= 8, calls
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    assert r.usage.completion_tokens < 400, r.usage
    print(f"        {len(calls)} calls in {r.usage.completion_tokens} tokens")


if __name__ == "__main__":
    runner.run(globals())
