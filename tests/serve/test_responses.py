#!/usr/bin/env python3
"""The Responses API (`/v1/responses`) through the official `openai` client.

Usage: python3 tests/serve/test_responses.py URL_PLAIN URL_TOOLS
URL_PLAIN serves SmolLM2 with its own template and the API key "sekrit";
URL_TOOLS serves it with
testdata/chat-templates/chatml-think-tools.jinja (a Hermes-style template
that knows tools). crates/onebit/tests/serve.rs starts both and runs this;
scripts/python-deps.sh installs openai and jsonschema. The oracle for every
greedy text is the chat-completions answer to the same messages on the same
server (same prompt, same engine). Prints "N passed, M failed"; exits 1 on
any failure.
"""
import json
import sys

import jsonschema
import openai
import runner  # tests/serve/runner.py, beside this script

PLAIN = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="sekrit", max_retries=0, timeout=120)
TOOLS = openai.OpenAI(base_url=sys.argv[2].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)
CAPITAL = "What is the capital of France? Answer with one word."
MODEL = PLAIN.models.list().data[0].id

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
# Responses' flat tool shape.
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
        "parameters": WEATHER, "strict": True}


def chat(client, messages, **kw):
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)
    return r.choices[0].message.content


def test_create_equals_the_chat_answer():
    r = PLAIN.responses.create(model=MODEL, input=CAPITAL, temperature=0, max_output_tokens=24)
    want = chat(PLAIN, [{"role": "user", "content": CAPITAL}], max_tokens=24)
    assert "Paris" in want, want
    assert r.output_text == want, (r.output_text, want)
    assert r.id.startswith("resp_") and r.object == "response", r
    assert [o.type for o in r.output] == ["message"], r.output
    assert r.status == "completed" and r.output[0].status == "completed", r
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage


def test_instructions_and_items_equal_the_chat_answer():
    # instructions are the system message; input items are the turns.
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
        {"role": "user", "content": "Name another one."},
    ]
    sys_text = "You answer in one word."
    r = PLAIN.responses.create(model=MODEL, instructions=sys_text, input=items, temperature=0, max_output_tokens=16)
    want = chat(PLAIN, [
        {"role": "system", "content": sys_text},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Name another one."},
    ], max_tokens=16)
    assert r.output_text == want, (r.output_text, want)
    assert r.instructions == sys_text, r.instructions


def test_max_output_tokens_cuts_as_incomplete():
    r = PLAIN.responses.create(model=MODEL, input="Count from one to fifty.", temperature=0, max_output_tokens=3)
    assert r.status == "incomplete", r
    assert r.incomplete_details.reason == "max_output_tokens", r.incomplete_details
    assert r.usage.output_tokens == 3, r.usage


def test_stream_builds_the_same_response():
    whole = PLAIN.responses.create(model=MODEL, input=CAPITAL, temperature=0, max_output_tokens=24)
    types, deltas = [], []
    with PLAIN.responses.stream(model=MODEL, input=CAPITAL, temperature=0, max_output_tokens=24) as s:
        for e in s:
            types.append(e.type)
            if e.type == "response.output_text.delta":
                deltas.append(e.delta)
        final = s.get_final_response()
    assert final.output_text == whole.output_text == "".join(deltas), (final.output_text, whole.output_text)
    # The order the API gives them in, each once but the deltas.
    seen = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
    assert seen == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ], seen
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens


def test_stream_sequence_numbers_count_up_from_zero():
    with PLAIN.responses.create(model=MODEL, input=CAPITAL, temperature=0, max_output_tokens=8, stream=True) as s:
        seqs = [e.sequence_number for e in s]
    assert seqs == list(range(len(seqs))), seqs


def test_previous_response_id_continues_the_conversation():
    first = PLAIN.responses.create(model=MODEL, input="Name a color.", temperature=0, max_output_tokens=12)
    second = PLAIN.responses.create(model=MODEL, previous_response_id=first.id, input="Name another one.",
                                    temperature=0, max_output_tokens=12)
    want = chat(PLAIN, [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Name another one."},
    ], max_tokens=12)
    assert second.output_text == want, (second.output_text, want)
    assert second.previous_response_id == first.id
    # Kept: GET gives it back; DELETE forgets it, and then it is a 404 naming it.
    got = PLAIN.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    PLAIN.responses.delete(first.id)
    try:
        PLAIN.responses.create(model=MODEL, previous_response_id=first.id, input="x", max_output_tokens=2)
        raise AssertionError("a forgotten previous_response_id was accepted")
    except openai.NotFoundError as e:
        assert e.body["param"] == "previous_response_id" and first.id in e.body["message"], e.body


def test_store_false_is_not_kept():
    r = PLAIN.responses.create(model=MODEL, input=CAPITAL, store=False, temperature=0, max_output_tokens=4)
    try:
        PLAIN.responses.retrieve(r.id)
        raise AssertionError("a response made with store false was kept")
    except openai.NotFoundError:
        pass


def test_text_format_json_schema_validates():
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    r = PLAIN.responses.create(model=MODEL, input="Describe Paris as JSON.", temperature=0, max_output_tokens=60,
                               text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema", r.text


def test_tool_round_trip_with_function_call_output():
    q = "What is the weather like in Paris right now?"
    r = TOOLS.responses.create(model=MODEL, input=q, tools=[TOOL], tool_choice="required",
                               parallel_tool_calls=False, temperature=0, max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert calls[0].call_id.startswith("call_"), calls[0]
    # The stateless round trip: the output items go back with the tool's
    # result; the answer equals chat completions' for the same turns.
    result = json.dumps({"temperature": 21, "unit": "celsius", "sky": "sunny"})
    follow = [{"role": "user", "content": q}] + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": result}]
    r2 = TOOLS.responses.create(model=MODEL, input=follow, tools=[TOOL], tool_choice="none",
                                temperature=0, max_output_tokens=40)
    want = chat(TOOLS, [
        {"role": "user", "content": q},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": result},
    ], tools=[{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}],
        tool_choice="none", max_tokens=40)
    assert r2.output_text == want, (r2.output_text, want)
    # The same through previous_response_id: only the output item is sent.
    r3 = TOOLS.responses.create(model=MODEL, previous_response_id=r.id, tools=[TOOL], tool_choice="none",
                                input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": result}],
                                temperature=0, max_output_tokens=40)
    assert r3.output_text == want, (r3.output_text, want)


def test_streamed_call_matches_the_whole_one():
    q = "What is the weather like in Paris right now?"
    args = dict(model=MODEL, input=q, tools=[TOOL], tool_choice="required", parallel_tool_calls=False,
                temperature=0, max_output_tokens=80)
    whole = [o for o in TOOLS.responses.create(**args).output if o.type == "function_call"]
    deltas = []
    with TOOLS.responses.stream(**args) as s:
        for e in s:
            if e.type == "response.function_call_arguments.delta":
                deltas.append(e.delta)
        final = s.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in whole], (streamed, whole)
    assert "".join(deltas) == whole[0].arguments


def test_bad_requests_are_400_naming_the_field():
    for kw, param, words in [
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/a.png"}]}]),
         "input", "this server fetches nothing"),
        (dict(input=CAPITAL, extra_body={"frobnicate": 1}), None, "frobnicate"),
        (dict(input=CAPITAL, tools=[{"type": "web_search"}]), "tools", "web_search"),
        (dict(input=CAPITAL, max_output_tokens=0), "max_output_tokens", "at least 1"),
        (dict(input=CAPITAL, temperature=3), "temperature", "between"),
        (dict(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}]), "input", "nope"),
        (dict(input=CAPITAL, text={"format": {"type": "json_schema", "name": "x"}}), "text.format", "schema"),
    ]:
        try:
            PLAIN.responses.create(model=MODEL, **kw)
            raise AssertionError(f"{kw} was accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
            assert e.body["param"] == param and words in e.body["message"], (kw, e.body)


runner.run(globals())
