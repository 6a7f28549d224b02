#!/usr/bin/env python3
"""Renders the chat templates in testdata/chat-templates/ the way transformers'
apply_chat_template renders them, and writes testdata/refs/chat-templates.json,
which crates/onebit-text/tests/chat.rs compares onebit's rendering with.

The environment is transformers' (utils/chat_template_utils.py,
_compile_jinja_template): an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, the loopcontrols extension and the {% generation %} tag, a tojson
filter that is json.dumps(ensure_ascii=False), and the raise_exception and
strftime_now globals. The special tokens are passed as keyword arguments, then
the case's extra arguments, then messages and add_generation_prompt.

Every mapping is given with its keys sorted (onebit's JSON values keep their
keys' order, serde_json's preserve_order, so either way tojson output agrees).

Needs only jinja2 (pip install jinja2). Run from anywhere:
    python3 scripts/gen_chat_refs.py
"""
import json
import pathlib
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "testdata" / "chat-templates"
OUT = ROOT / "testdata" / "refs" / "chat-templates.json"


class Generation(Extension):
    """transformers' AssistantTracker, minus the mask bookkeeping: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def sort_keys(v):
    if isinstance(v, dict):
        return {k: sort_keys(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [sort_keys(x) for x in v]
    return v


def U(text, **kw):
    return {"role": "user", "content": text, **kw}


def A(text, **kw):
    return {"role": "assistant", "content": text, **kw}


def S(text):
    return {"role": "system", "content": text}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}}

CONVERSATIONS = {
    "one-user": [U("What is the capital of France? Answer with one word.")],
    "system-user": [S("You are terse."), U("Hi!")],
    "multi-turn": [U("2+2?"), A("4"), U("  And 3+3?  ")],
    "unicode": [U("Ünïcödé ✓ and\nnew lines\ttabs \"quoted\" <tags> & 'apostrophes'")],
    "not-alternating": [U("one"), U("two")],
    "content-parts": [S([{"type": "text", "text": "Be brief."}]), U([{"type": "text", "text": "Describe "}, {"type": "image"}, {"type": "text", "text": " this."}])],
    "thinking-history": [
        U("First question?"),
        A("<think>\nLet me think.\n</think>\n\nFirst answer."),
        U("Second question?"),
        A("<think>\nMore thought.\n</think>\n\nSecond answer."),
    ],
    "tool-round-trip": [
        S("You can check the weather."),
        U("Weather in Paris?"),
        A("", tool_calls=[TOOL_CALL]),
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "sunny"},
    ],
    # As the openai client sends a call and its result: content None, the
    # arguments a JSON string, the result tied to its call by tool_call_id.
    "tool-call-openai": [
        U("Weather in Paris?"),
        A(None, tool_calls=[{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]),
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        A("It is 21 degrees."),
    ],
    "named": [U("Who are you?", name="alice"), A("A model."), {"role": "skip", "content": "x"}, U("ok")],
}

CASES = [
    ("gemma3.jinja", ["one-user", "system-user", "multi-turn", "unicode", "not-alternating", "content-parts"], [{}]),
    ("chatml-think-tools.jinja", ["one-user", "system-user", "multi-turn", "thinking-history", "tool-round-trip", "tool-call-openai"],
     [{}, {"enable_thinking": False}, {"tools": [WEATHER_TOOL]}]),
    ("llama3-dated.jinja", ["one-user", "system-user", "multi-turn", "tool-round-trip", "tool-call-openai"],
     [{}, {"date_string": "01 Jan 2025", "tools": [WEATHER_TOOL]}]),
    ("mistral-alternating.jinja", ["one-user", "system-user", "multi-turn", "not-alternating", "tool-round-trip"], [{}]),
    ("python-features.jinja", ["multi-turn", "named"], [{"meta": {"b": 2, "a": "x", "c": [1.5, None, True]}, "flag": True}]),
]

TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def main():
    env = environment()
    out = {"generator": "scripts/gen_chat_refs.py", "jinja2": jinja2.__version__, "special_tokens": TOKENS, "cases": []}
    for name, convs, extras in CASES:
        template = env.from_string((TEMPLATES / name).read_text())
        for conv in convs:
            for extra in extras:
                for agp in (True, False):
                    messages = sort_keys(CONVERSATIONS[conv])
                    extra = sort_keys(extra)
                    case = {"template": name, "conversation": conv, "messages": messages,
                            "add_generation_prompt": agp, "extra": extra}
                    try:
                        case["rendered"] = template.render(
                            **{**TOKENS, **extra}, messages=messages, add_generation_prompt=agp)
                    except jinja2.exceptions.TemplateError as e:
                        case["error"] = str(e)
                    out["cases"].append(case)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT.relative_to(ROOT)}: {len(out['cases'])} cases")


if __name__ == "__main__":
    main()
