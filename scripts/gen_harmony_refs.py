#!/usr/bin/env python3
"""Writes testdata/refs/harmony.json: gpt-oss conversations rendered two ways,
which crates/onebit-text/tests/harmony.rs compares onebit's rendering with.

- `template`: gpt-oss's chat_template.jinja (testdata/chat-templates/gpt-oss.jinja)
  through Python jinja2 set up as transformers sets it up (gen_chat_refs.py's
  environment), strftime_now pinned to DATE.
- `harmony`: the official openai-harmony package (PyPI, pinned in
  scripts/python-deps.sh) rendering the same conversation for completion by
  the assistant, given the same date (harmony prints a date only when given
  one) and the same reasoning effort. Its o200k vocabulary is supplied
  locally (TIKTOKEN_ENCODINGS_BASE, a directory holding o200k_base.tiktoken;
  scripts/gen-o200k-harmony.py's source, the bpe-openai crate, has it).

Where the two disagree the case says so (`harmony_differs`): the template
JSON-quotes a tool's result and writes a call's content type without
`<|constrain|>`, which harmony does not.

    TIKTOKEN_ENCODINGS_BASE=DIR python3 scripts/gen_harmony_refs.py
"""
import importlib.util
import json
import pathlib
from datetime import datetime, timezone

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "testdata" / "chat-templates" / "gpt-oss.jinja"
OUT = ROOT / "testdata" / "refs" / "harmony.json"
# 2025-08-05T00:00:00Z (gpt-oss's release; not today, so an unpinned clock shows): what
# strftime_now gives on both sides.
NOW = 1_754_352_000
DATE = datetime.fromtimestamp(NOW, timezone.utc)
SPECIAL = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["query", "tags"],
        },
    },
}
NOARGS = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}}

U = lambda t: {"role": "user", "content": t}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'}

CASES = [
    ("user", [U("What is 2 + 2?")], {}),
    ("user-low", [U("What is 2 + 2?")], {"reasoning_effort": "low"}),
    ("user-medium", [U("What is 2 + 2?")], {"reasoning_effort": "medium"}),
    ("user-high", [U("What is 2 + 2?")], {"reasoning_effort": "high"}),
    ("system", [{"role": "system", "content": "Answer in French."}, U("Hello!")], {}),
    ("developer", [{"role": "developer", "content": "Be terse.\nNo lists."}, U("Hello!")], {"reasoning_effort": "low"}),
    ("multi-turn", [U("Hi"), {"role": "assistant", "content": "Hello! How can I help?"}, U("Tell me a joke.")], {}),
    ("tools", [U("Weather in Paris?")], {"tools": [WEATHER, SEARCH, NOARGS]}),
    ("tools-system-high", [{"role": "system", "content": "Use tools."}, U("Weather in Paris?")], {"tools": [WEATHER], "reasoning_effort": "high"}),
    ("tool-call", [U("Weather in Paris?"), CALL], {"tools": [WEATHER]}),
    ("tool-call-result", [U("Weather in Paris?"), CALL, RESULT], {"tools": [WEATHER]}),
    (
        "tool-call-thinking-result",
        [U("Weather in Paris?"), dict(CALL, thinking="I should call get_weather."), RESULT],
        {"tools": [WEATHER], "reasoning_effort": "low"},
    ),
    ("model-identity", [U("Who are you?")], {"model_identity": "You are a helpful assistant."}),
]


def jinja_env():
    spec = importlib.util.spec_from_file_location("gen_chat_refs", ROOT / "scripts" / "gen_chat_refs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    env = mod.environment()
    env.globals["strftime_now"] = lambda fmt: DATE.strftime(fmt)
    return env


def harmony_render(messages, kw):
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        HarmonyEncodingName,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
        load_harmony_encoding,
    )

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    effort = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
    system = SystemContent.new().with_reasoning_effort(effort[kw.get("reasoning_effort", "medium")])
    system = system.with_conversation_start_date(DATE.strftime("%Y-%m-%d"))
    if "model_identity" in kw:
        system = system.with_model_identity(kw["model_identity"])
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    rest = messages
    instructions = None
    if messages and messages[0]["role"] in ("system", "developer"):
        instructions = messages[0]["content"]
        rest = messages[1:]
    tools = kw.get("tools")
    if instructions or tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if tools:
            dev = dev.with_function_tools(
                [ToolDescription.new(t["function"]["name"], t["function"]["description"], parameters=t["function"]["parameters"]) for t in tools]
            )
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    last_call = None
    for m in rest:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "assistant" and m.get("tool_calls"):
            thought = m.get("thinking") or m.get("content")
            if thought:
                out.append(Message.from_role_and_content(Role.ASSISTANT, thought).with_channel("analysis"))
            f = m["tool_calls"][0]["function"]
            last_call = f["name"]
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, json.dumps(f["arguments"]))
                .with_channel("commentary")
                .with_recipient("functions." + f["name"])
                .with_content_type("<|constrain|>json")
            )
        elif m["role"] == "assistant":
            out.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final"))
        elif m["role"] == "tool":
            out.append(
                Message.from_author_and_content(Author.new(Role.TOOL, "functions." + last_call), m["content"])
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    conv = Conversation.from_messages(out)
    return enc.decode(enc.render_conversation_for_completion(conv, Role.ASSISTANT))


def main():
    env = jinja_env()
    tmpl = env.from_string(TEMPLATE.read_text())
    cases = []
    for name, messages, kw in CASES:
        rendered = tmpl.render(**SPECIAL, **kw, messages=messages, add_generation_prompt=True)
        harmony = harmony_render(messages, kw)
        c = {"name": name, "messages": messages, "extra": kw, "template": rendered, "harmony": harmony}
        c["harmony_differs"] = rendered != harmony
        cases.append(c)
    doc = {
        "template": TEMPLATE.name,
        "now": NOW,
        "special_tokens": SPECIAL,
        "add_generation_prompt": True,
        "cases": cases,
    }
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    differs = [c["name"] for c in cases if c["harmony_differs"]]
    print(f"{OUT}: {len(cases)} cases; the template and openai-harmony differ on {differs}")


if __name__ == "__main__":
    main()
