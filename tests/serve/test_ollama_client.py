#!/usr/bin/env python3
"""onebit serve's Ollama API through the official `ollama` Python client.

Usage: python3 tests/serve/test_ollama_client.py http://127.0.0.1:PORT
(crates/onebit/tests/serve.rs starts the server on SmolLM2-135M-Instruct and
runs this; the client is installed by scripts/python-deps.sh.) Prints
"N passed, M failed"; exits 1 on any failure.
"""
import json
import math
import sys

import ollama
import runner  # tests/serve/runner.py, beside this script

client = ollama.Client(host=sys.argv[1].rstrip("/"), timeout=120)
CAPITAL = "What is the capital of France? Answer with one word."
GREEDY = {"temperature": 0, "num_predict": 24}
MODEL = None


def ask(**kw):
    args = dict(model=MODEL, messages=[{"role": "user", "content": CAPITAL}], options=GREEDY)
    args.update(kw)
    return client.chat(**args)


def test_tags_and_show():
    global MODEL
    models = client.list().models
    assert len(models) == 1, models
    MODEL = models[0].model
    assert MODEL.startswith("SmolLM2"), MODEL
    assert models[0].size > 50_000_000, models[0]
    assert models[0].details.family == "llama", models[0].details
    assert models[0].details.format == "gguf"
    s = client.show(MODEL)
    assert "<|im_start|>" in s.template, s.template
    assert s.modelinfo["llama.embedding_length"] == 576, s.modelinfo
    assert "embedding" in s.capabilities and "completion" in s.capabilities, s.capabilities


def test_version():
    import httpx
    v = httpx.get(sys.argv[1].rstrip("/") + "/api/version").json()
    assert v["version"].count(".") == 2, v


def test_chat_known_answer_and_counts():
    r = ask(stream=False)
    assert "Paris" in r.message.content, r.message.content
    assert r.message.role == "assistant"
    assert r.done and r.done_reason == "stop", r
    assert r.prompt_eval_count > 5 and 0 < r.eval_count <= 24, r
    assert r.total_duration >= r.eval_duration > 0, r
    assert r.total_duration >= r.prompt_eval_duration > 0, r
    # Nanoseconds: a run of 40 prompt tokens takes well over 1 ms and under 120 s.
    assert 1e6 < r.total_duration < 120e9, r


def test_chat_stream_matches_whole():
    whole = ask(stream=False).message.content
    parts = list(ask(stream=True))
    assert len(parts) > 2, parts
    assert all(not p.done for p in parts[:-1]) and parts[-1].done, parts
    text = "".join(p.message.content for p in parts)
    assert text == whole, (text, whole)
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count > 0, parts[-1]


def test_stream_is_the_default():
    import httpx
    r = httpx.post(sys.argv[1].rstrip("/") + "/api/chat", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": CAPITAL}], "options": GREEDY})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson", r.headers
    lines = [json.loads(l) for l in r.text.splitlines()]
    assert len(lines) > 2 and lines[-1]["done"] and not lines[0]["done"], lines


def test_num_predict_cuts_with_length():
    r = ask(stream=False, options={"temperature": 0, "num_predict": 2})
    assert r.done_reason == "length" and r.eval_count == 2, r


def test_generate_uses_the_template_and_raw_does_not():
    r = client.generate(model=MODEL, prompt=CAPITAL, options=GREEDY, stream=False)
    assert "Paris" in r.response, r.response
    assert r.done_reason == "stop", r
    parts = list(client.generate(model=MODEL, prompt=CAPITAL, options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == r.response
    # Raw: a plain continuation, as `onebit run` gives it (" Paris").
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 3}, stream=False)
    assert raw.response.startswith(" Paris"), raw.response


def test_embed():
    r = client.embed(model=MODEL, input=["The cat sat on the mat.", "Paris is in France."])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576
    for v in r.embeddings:
        assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5
    one = client.embed(model=MODEL, input="Paris is in France.").embeddings[0]
    assert one == r.embeddings[1]
    assert r.prompt_eval_count > 8, r


# The structured-output and tool tests below check outputs with jsonschema
# (installed by scripts/python-deps.sh for the /v1 tests), not with our code.
PARIS_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "rank": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "country", "rank"],
    "additionalProperties": False,
}


def test_format_json_and_schema_constrain_the_answer():
    import jsonschema
    r = ask(stream=False, format="json", options={"temperature": 0, "num_predict": 60})
    assert isinstance(json.loads(r.message.content), dict), r.message.content
    for opts in ({"temperature": 0, "num_predict": 80}, {"temperature": 0.9, "seed": 7, "num_predict": 80}):
        r = ask(stream=False, format=PARIS_SCHEMA, options=opts)
        jsonschema.validate(json.loads(r.message.content), PARIS_SCHEMA)
    # /api/generate, streamed: the pieces join to a valid document too.
    parts = list(client.generate(model=MODEL, prompt="Describe Paris.", format=PARIS_SCHEMA,
                                 options={"temperature": 0, "num_predict": 80}, stream=True))
    jsonschema.validate(json.loads("".join(p.response for p in parts)), PARIS_SCHEMA)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# A conversation in Ollama's shapes: the assistant's call with arguments as an
# object, the tool's reply named by `tool_name`.
TOOL_TURNS = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_name": "get_weather", "content": "21 degrees and sunny"},
]


def test_tools_round_trip_and_calls_come_back_in_ollama_shape():
    import jsonschema
    base = ask(stream=False, messages=TOOL_TURNS[:1], options={"temperature": 0, "num_predict": 1})
    r = ask(stream=False, messages=TOOL_TURNS, tools=[WEATHER], options={"temperature": 0, "num_predict": 40})
    # The tools, the call and its result reached the prompt (SmolLM2's own
    # template knows no tools: the generic fallback carries them).
    assert r.prompt_eval_count > base.prompt_eval_count + 40, (base.prompt_eval_count, r.prompt_eval_count)
    # Greedy SmolLM2 asks again for the weather, in the fallback's call
    # format: parsed into `tool_calls`, arguments an object that fits the schema.
    calls = r.message.tool_calls
    assert calls and r.done_reason == "stop", r.message
    for c in calls:
        assert c.function.name == "get_weather", c
        jsonschema.validate(dict(c.function.arguments), WEATHER["function"]["parameters"])
    assert "tool_call" not in (r.message.content or ""), r.message.content
    # Streamed: the call comes whole in one chunk, the same call.
    parts = list(ask(stream=True, messages=TOOL_TURNS, tools=[WEATHER], options={"temperature": 0, "num_predict": 40}))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == \
        [(c.function.name, dict(c.function.arguments)) for c in calls], (streamed, calls)
    assert "".join(p.message.content for p in parts) == (r.message.content or "")


def test_refusals_name_the_field():
    cases = [
        (dict(options={"temperature": 5}), "options.temperature"),
        (dict(options={"repeat_penalty": 0}), "options.repeat_penalty"),
        (dict(format={"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}),
         "format"),
    ]
    for kw, name in cases:
        try:
            ask(stream=False, **kw)
        except ollama.ResponseError as e:
            assert e.status_code == 400 and name in e.error, (kw, e.error)
        else:
            raise AssertionError(f"{kw} was accepted")
    # What the client itself would refuse to send, in raw JSON.
    import httpx
    for body, name in (({"format": "yaml"}, "format"), ({"tools": "get_weather"}, "tools"),
                       ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]},
                        "tool_calls")):
        req = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False, **body}
        r = httpx.post(sys.argv[1].rstrip("/") + "/api/chat", json=req, timeout=120)
        assert r.status_code == 400 and name in r.json()["error"], (body, r.text)

def fnv1a_ids(ids):
    """FNV-1a (64 bit) of token ids as little-endian u32 bytes, the first
    256 ids (docs/deploy.md: the x-onebit-prefix-hash rule)."""
    h = 0xcbf29ce484222325
    for i in ids[:256]:
        for b in i.to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) % 2**64
    return f"{h:016x}"


def test_every_completion_carries_the_prefix_hash():
    import httpx
    base = sys.argv[1].rstrip("/")
    # Token ids as the prompt: the header is FNV-1a of exactly those ids.
    ids = [1, 2, 3, 300]
    r = httpx.post(base + "/v1/completions", json={"prompt": ids, "max_tokens": 1}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["x-onebit-prefix-hash"] == fnv1a_ids(ids), r.headers
    # One user message renders to the same prompt on /v1 and on Ollama's
    # routes, whole or streamed: the same hash on every answer.
    msgs = [{"role": "user", "content": CAPITAL}]
    r = httpx.post(base + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}, timeout=120)
    want = r.headers["x-onebit-prefix-hash"]
    for path, body in (("/api/chat", {"messages": msgs}), ("/api/generate", {"prompt": CAPITAL})):
        for stream in (False, True):
            req = {"model": MODEL, "stream": stream, "options": {"num_predict": 1}, **body}
            r = httpx.post(base + path, json=req, timeout=120)
            assert r.status_code == 200, (path, stream, r.text)
            assert r.headers.get("x-onebit-prefix-hash") == want, (path, stream, r.headers)


if __name__ == "__main__":
    runner.run(globals())
