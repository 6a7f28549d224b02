#!/usr/bin/env python3
"""onebit serve on an EmbeddingGemma model (gemma-embedding), through the
official `openai` client: /v1/embeddings answers, the same text twice gives
the same vector, and a generative call is refused by name.

Usage: python3 tests/serve/test_embedding_gemma.py http://127.0.0.1:PORT
(crates/onebit/tests/serve_embedding_gemma.rs starts the server on the tiny
gemma-embedding fixture with a byte vocabulary added, and runs this.)
Prints "N passed, M failed"; exits 1 on any failure.
"""
import math
import sys

import openai
import runner  # tests/serve/runner.py, beside this script

client = openai.OpenAI(base_url=sys.argv[1].rstrip("/") + "/v1", api_key="x", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
N_EMBD = 64  # the fixture's embedding_length (testdata/llamacpp/README.md)


def vec(r, i=0):
    return r.data[i].embedding


def test_same_text_twice_same_vector_normalized():
    a = client.embeddings.create(model=MODEL, input="The cat sat on the mat.")
    b = client.embeddings.create(model=MODEL, input="The cat sat on the mat.")
    assert len(vec(a)) == N_EMBD, len(vec(a))
    assert vec(a) == vec(b)
    assert abs(math.sqrt(sum(x * x for x in vec(a))) - 1) < 1e-5


def test_a_list_gives_one_vector_per_text_in_order():
    texts = ["one", "two words", "one"]
    r = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in r.data] == [0, 1, 2]
    assert vec(r, 0) == vec(r, 2) and vec(r, 0) != vec(r, 1)
    assert vec(r, 1) == vec(client.embeddings.create(model=MODEL, input="two words"))


def test_generation_is_refused_by_name():
    for call in (lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}]),
                 lambda: client.completions.create(model=MODEL, prompt="hi")):
        try:
            call()
        except openai.BadRequestError as e:
            assert "embedding model" in e.message and "gemma-embedding" in e.message, e.message
        else:
            raise AssertionError("a generative call on an embedding model was accepted")


if __name__ == "__main__":
    runner.run(globals())
