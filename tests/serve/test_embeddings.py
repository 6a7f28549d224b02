#!/usr/bin/env python3
"""onebit serve's /v1/embeddings through the official `openai` client.

Usage: python3 tests/serve/test_embeddings.py http://127.0.0.1:PORT
(crates/onebit/tests/serve.rs starts the server on SmolLM2-135M-Instruct and
runs this.) Prints "N passed, M failed"; exits 1 on any failure.
"""
import base64
import math
import struct
import sys

import openai
import runner  # tests/serve/runner.py, beside this script

client = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "Quantized inference on the CPU."]


def vec(r, i=0):
    return r.data[i].embedding


def cos(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_one_string_normalized_and_repeatable():
    a = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert len(a.data) == 1 and len(vec(a)) == 576, len(vec(a))
    assert abs(math.sqrt(sum(x * x for x in vec(a))) - 1) < 1e-5
    b = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert vec(a) == vec(b)
    assert a.usage.prompt_tokens > 3


def test_list_equals_one_by_one():
    batch = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in batch.data] == [0, 1, 2]
    for i, t in enumerate(TEXTS):
        assert vec(batch, i) == vec(client.embeddings.create(model=MODEL, input=t)), t


def test_base64_is_the_same_floats():
    f = vec(client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float"))
    # The client decodes base64 itself (numpy-free path); check the raw body too.
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS[1], encoding_format="base64")
    b64 = raw.http_response.json()["data"][0]["embedding"]
    floats = list(struct.unpack(f"<{len(f)}f", base64.b64decode(b64)))
    assert floats == f


def test_similar_texts_are_closer():
    r = client.embeddings.create(model=MODEL, input=["Paris is the capital of France.",
                                                    "The capital of France is Paris.",
                                                    "Bananas are rich in potassium."])
    same, other = cos(vec(r, 0), vec(r, 1)), cos(vec(r, 0), vec(r, 2))
    assert same > other, (same, other)


def test_bad_requests_name_the_field():
    for kw, name in ((dict(dimensions=64), "dimensions"), (dict(encoding_format="int8"), "encoding_format")):
        try:
            client.embeddings.create(model=MODEL, input="x", **kw)
        except openai.BadRequestError as e:
            assert name in e.message, (kw, e.message)
        else:
            raise AssertionError(f"{kw} was accepted")
    # A field this server does not read is answered and named (issue 29:
    # the x-onebit-ignored-fields header; a 400 under --strict-fields).
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="x", extra_body={"pooling": "max"})
    assert raw.headers["x-onebit-ignored-fields"] == "pooling", raw.headers
    assert len(raw.parse().data[0].embedding) == 576
    try:
        client.embeddings.create(model=MODEL, input=[])
    except openai.BadRequestError as e:
        assert "input" in e.message
    else:
        raise AssertionError("an empty input list was accepted")


if __name__ == "__main__":
    runner.run(globals())
