#!/usr/bin/env python3
"""The Messages API (`/v1/messages`) through the official `anthropic` client.

Usage: python3 tests/serve/test_anthropic.py URL_PLAIN URL_TOOLS
URL_PLAIN serves SmolLM2 with its own template and the API key "sekrit";
URL_TOOLS serves it with testdata/chat-templates/chatml-think-tools.jinja (a
Hermes-style template that knows tools). crates/onebit/tests/serve.rs starts
both and runs this; scripts/python-deps.sh installs anthropic, openai and
jsonschema. The oracle for every greedy text is the chat-completions answer
to the same messages on the same server (same prompt, same engine), asked
through the official `openai` client. This client offers no `temperature`
any more; Anthropic's API field goes in `extra_body`. Prints "N passed, M
failed"; exits 1 on any failure.
"""
import json
import sys
import urllib.error
import urllib.request

import anthropic
import jsonschema
import openai
import runner  # tests/serve/runner.py, beside this script

KEY = "sekrit"
PLAIN = anthropic.Anthropic(base_url=sys.argv[1].rstrip("/"), api_key=KEY, max_retries=0, timeout=120)
TOOLS = anthropic.Anthropic(base_url=sys.argv[2].rstrip("/"), api_key="x", max_retries=0, timeout=120)
OAI_PLAIN = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key=KEY, max_retries=0, timeout=120)
OAI_TOOLS = openai.OpenAI(base_url=sys.argv[2].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)
MODEL = OAI_PLAIN.models.list().data[0].id
GREEDY = {"temperature": 0}
CAPITAL = "What is the capital of France? Answer with one word."

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER}


def chat(client, messages, **kw):
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)
    return r.choices[0]


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def test_create_equals_the_chat_answer():
    m = PLAIN.messages.create(model=MODEL, max_tokens=24, messages=[{"role": "user", "content": CAPITAL}],
                              extra_body=GREEDY)
    want = chat(OAI_PLAIN, [{"role": "user", "content": CAPITAL}], max_tokens=24)
    assert "Paris" in want.message.content, want
    assert text_of(m) == want.message.content, (m.content, want.message.content)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert m.stop_reason == "end_turn" and m.stop_sequence is None, m
    assert m.usage.output_tokens > 0 and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0, m.usage


def test_system_blocks_and_turns_equal_the_chat_answer():
    system = [{"type": "text", "text": "You answer in one word."}]
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "Name a color."}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Name another one."},
    ]
    m = PLAIN.messages.create(model=MODEL, max_tokens=16, system=system, messages=turns, extra_body=GREEDY)
    want = chat(OAI_PLAIN, [{"role": "system", "content": "You answer in one word."},
                            {"role": "user", "content": "Name a color."},
                            {"role": "assistant", "content": "Blue."},
                            {"role": "user", "content": "Name another one."}], max_tokens=16)
    assert text_of(m) == want.message.content, (m.content, want.message.content)


def test_max_tokens_and_stop_sequences_say_why_they_stopped():
    q = [{"role": "user", "content": "Count from one to fifty, in words."}]
    cut = PLAIN.messages.create(model=MODEL, max_tokens=3, messages=q, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3, cut
    full = text_of(PLAIN.messages.create(model=MODEL, max_tokens=40, messages=q, extra_body=GREEDY))
    # A stop sequence taken from the greedy text itself: the answer ends just
    # before it, and names it.
    assert len(full) > 8, full
    stop = full[len(full) // 2:len(full) // 2 + 3]
    m = PLAIN.messages.create(model=MODEL, max_tokens=40, messages=q, stop_sequences=["zzz", stop],
                              extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
    assert text_of(m) == full[:full.index(stop)], (text_of(m), full)


def test_stream_events_in_anthropics_order_build_the_same_message():
    args = dict(model=MODEL, max_tokens=24, messages=[{"role": "user", "content": CAPITAL}], extra_body=GREEDY)
    whole = PLAIN.messages.create(**args)
    raw = [e.type for e in PLAIN.messages.create(stream=True, **args)]
    seen = [t for i, t in enumerate(raw) if i == 0 or t != raw[i - 1]]
    # ping is read (and skipped) by the client; the rest come in this order.
    assert seen == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                    "message_delta", "message_stop"], seen
    with PLAIN.messages.stream(**args) as s:
        deltas = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(deltas) == text_of(final) == text_of(whole), (deltas, whole.content)
    assert final.stop_reason == whole.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_tool_round_trip_tool_use_then_tool_result():
    q = "What is the weather like in Paris right now?"
    m = TOOLS.messages.create(model=MODEL, max_tokens=80, messages=[{"role": "user", "content": q}], tools=[TOOL],
                              tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather", m.content
    jsonschema.validate(uses[0].input, WEATHER)
    assert uses[0].id.startswith("toolu_"), uses[0]
    result = json.dumps({"temperature": 21, "unit": "celsius", "sky": "sunny"})
    follow = [
        {"role": "user", "content": q},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": result}]},
    ]
    m2 = TOOLS.messages.create(model=MODEL, max_tokens=40, messages=follow, tools=[TOOL],
                               tool_choice={"type": "none"}, extra_body=GREEDY)
    want = chat(OAI_TOOLS, [
        {"role": "user", "content": q},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": uses[0].id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(uses[0].input, separators=(",", ":"))}}]},
        {"role": "tool", "tool_call_id": uses[0].id, "content": result},
    ], tools=[{"type": "function", "function": {"name": "get_weather", "description": TOOL["description"],
                                                "parameters": WEATHER}}], tool_choice="none", max_tokens=40)
    assert text_of(m2) == want.message.content, (m2.content, want.message.content)
    assert m2.stop_reason in ("end_turn", "max_tokens"), m2


def test_streamed_tool_use_matches_the_whole_one():
    args = dict(model=MODEL, max_tokens=80, messages=[{"role": "user", "content": "Weather in Paris?"}],
                tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    whole = [b for b in TOOLS.messages.create(**args).content if b.type == "tool_use"]
    with TOOLS.messages.stream(**args) as s:
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in whole], (streamed, whole)
    assert final.stop_reason == "tool_use"


def test_count_tokens_is_the_prompt_the_answer_used():
    msgs = [{"role": "user", "content": CAPITAL}]
    n = PLAIN.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    m = PLAIN.messages.create(model=MODEL, max_tokens=4, messages=msgs, extra_body=GREEDY)
    used = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert n == used, (n, m.usage)
    # The same count chat completions reports for the same messages.
    oai = OAI_PLAIN.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1, temperature=0)
    assert n == oai.usage.prompt_tokens, (n, oai.usage)
    # Tools are part of the prompt.
    with_tools = TOOLS.messages.count_tokens(model=MODEL, messages=msgs, tools=[TOOL]).input_tokens
    without = TOOLS.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    assert with_tools > without, (with_tools, without)


def test_errors_in_anthropics_shape():
    for kw, words in [
        (dict(messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
         "not a PNG, JPEG or WebP"),
        (dict(messages=[{"role": "user", "content": "hi"}], extra_body={"frobnicate": 1}), "frobnicate"),
        (dict(messages=[{"role": "user", "content": "hi"}], tools=[{"type": "web_search_20250305", "name": "web_search"}]),
         "web_search_20250305"),
    ]:
        try:
            PLAIN.messages.create(model=MODEL, max_tokens=8, **kw)
            raise AssertionError(f"{kw} was accepted")
        except anthropic.BadRequestError as e:
            assert e.status_code == 400, e
            assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
            assert words in e.body["error"]["message"], e.body
    # max_tokens is required, as Anthropic requires it (the client will not
    # send a body without it, so this one goes by hand).
    req = urllib.request.Request(sys.argv[1].rstrip("/") + "/v1/messages", method="POST",
                                 data=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(),
                                 headers={"content-type": "application/json", "x-api-key": KEY,
                                          "anthropic-version": "2023-06-01"})
    try:
        urllib.request.urlopen(req, timeout=60)
        raise AssertionError("a body without max_tokens was accepted")
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        assert e.code == 400 and body["type"] == "error", body
        assert "max_tokens" in body["error"]["message"], body
    # An unknown model is a 404 not_found_error; a wrong key a 401
    # authentication_error, both in this shape.
    try:
        PLAIN.messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("unknown model accepted")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error" and "no-such-model" in e.body["error"]["message"], e.body
    wrong = anthropic.Anthropic(base_url=sys.argv[1].rstrip("/"), api_key="wrong", max_retries=0)
    try:
        wrong.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "authentication_error", e.body


runner.run(globals())
