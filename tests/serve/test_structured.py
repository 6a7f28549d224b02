#!/usr/bin/env python3
"""Structured output through the official `openai` client: 50 (schema, prompt)
pairs made here (enums, nested objects, arrays with min/max items, patterns,
bounded integers; all `strict`), every reply parsed and validated with
jsonschema, on every server given, half greedy and half sampled; plus
json_object, a Lark grammar, and a schema the library cannot handle.

Usage: python3 tests/serve/test_structured.py URL [URL ...]
(crates/onebit/tests/serve.rs starts SmolLM2 and Gemma 3 servers and runs
this.) Prints "N passed, M failed"; exits 1 on any failure.
"""
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import runner  # tests/serve/runner.py, beside this script

CLIENTS = [openai.OpenAI(base_url=u.rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=300)
           for u in sys.argv[1:]]
PAIRS = 50

TOPICS = ["a cat", "the city of Lyon", "a red bicycle", "a chess game", "a rainy day", "a bakery",
          "a small robot", "the planet Mars", "a jazz concert", "a mountain hike"]


def prop(rng, depth):
    """One property schema, bounded so any valid value is short."""
    kind = rng.choice(["enum", "int", "bool", "pattern", "short", "array", "object"] if depth < 2
                      else ["enum", "int", "bool", "pattern", "short"])
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(["red", "green", "blue", "small", "large", "yes", "no"], 3)}
    if kind == "int":
        lo = rng.randint(-5, 5)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([3, 50, 999])}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[A-Z]{3}-[0-9]{2}$", "^[a-z]{2,6}$", "^(yes|no|maybe)$"])}
    if kind == "short":
        return {"type": "string", "maxLength": rng.choice([4, 12])}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": prop(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
    return obj(rng, depth + 1)


def obj(rng, depth):
    names = rng.sample(["name", "color", "size", "count", "tags", "ok", "code", "info", "level", "parts"],
                       rng.randint(1, 3))
    return {"type": "object", "properties": {n: prop(rng, depth) for n in names},
            "required": names, "additionalProperties": False}


def pair(i):
    rng = random.Random(i)
    schema = obj(rng, 0)
    return schema, f"Describe {TOPICS[i % len(TOPICS)]} as JSON."


def name(client):
    """The model the server serves (a request must name it)."""
    return client.models.list().data[0].id


def run(client, i):
    schema, prompt = pair(i)
    greedy = i % 2 == 0
    r = client.chat.completions.create(
        model=name(client), messages=[{"role": "user", "content": prompt}], max_tokens=160,
        temperature=0 if greedy else 0.8, seed=i,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    text = r.choices[0].message.content
    try:
        jsonschema.validate(json.loads(text), schema)
        assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
    except Exception as e:
        raise AssertionError(f"pair {i} ({'greedy' if greedy else 'sampled'}): {e}\nschema {schema}\nreply {text!r}")
    return r.usage.completion_tokens


def test_fifty_schemas_on_every_model_greedy_and_sampled():
    for c in CLIENTS:
        with ThreadPoolExecutor(8) as ex:
            tokens = list(ex.map(lambda i: run(c, i), range(PAIRS)))
        print(f"        {c.base_url}: {PAIRS} replies valid, {sum(tokens)} tokens")


def test_json_object_gives_an_object():
    for c in CLIENTS:
        r = c.chat.completions.create(model=name(c), messages=[{"role": "user", "content": "List two fruits."}],
                                      max_tokens=60, temperature=0, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert text.lstrip().startswith("{"), text


def test_lark_grammar_field():
    for c in CLIENTS:
        r = c.chat.completions.create(model=name(c), messages=[{"role": "user", "content": "Is the sky blue?"}],
                                      max_tokens=10, temperature=0,
                                      extra_body={"grammar": 'start: ("yes" | "no") "."'})
        assert r.choices[0].message.content in ("yes.", "no."), r.choices[0].message.content


def test_unsupported_schema_is_400_naming_it():
    c = CLIENTS[0]
    try:
        c.chat.completions.create(
            model=name(c), messages=[{"role": "user", "content": "x"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {
                "name": "bad", "strict": True,
                "schema": {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}}})
    except openai.BadRequestError as e:
        assert e.body.get("param") == "response_format", e.body
        assert "no-such-format" in e.body.get("message", ""), e.body
    else:
        raise AssertionError("an unknown string format was accepted")


if __name__ == "__main__":
    runner.run(globals())
