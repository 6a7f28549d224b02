#!/usr/bin/env python3
"""LangChain's OpenAI integration against onebit serve, unchanged: ChatOpenAI
invoke and stream, with_structured_output in its three methods, and
OpenAIEmbeddings as LangChain's docs set it up for servers other than OpenAI's
(check_embedding_ctx_length=False: its default sends tiktoken ids, which are no
other model's ids, and fetches tiktoken's tables from the network).

Usage: python3 tests/serve/test_langchain_openai.py URL
URL serves SmolLM2-135M-Instruct (its own template: tools go through the
generic fallback). crates/onebit/tests/serve.rs starts it and runs this;
scripts/python-deps.sh installs langchain-openai and openai. Prints
"N passed, M failed"; exits 1 on any failure.
"""
import sys

import openai
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field

import runner  # tests/serve/runner.py, beside this script

URL = sys.argv[1].rstrip("/") + "/v1"
CLIENT = openai.OpenAI(base_url=URL, api_key="x", max_retries=0, timeout=120)
MODEL = CLIENT.models.list().data[0].id
CAPITAL = "What is the capital of France? Answer with one word."


def chat(**kw):
    return ChatOpenAI(base_url=URL, api_key="x", model=MODEL, temperature=0, max_retries=0, timeout=120, **kw)


def test_invoke_gives_what_the_official_client_gives():
    r = chat(max_tokens=16).invoke(CAPITAL)
    # The official client's answer to the same greedy request.
    want = CLIENT.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": CAPITAL}],
                                          temperature=0, max_tokens=16)
    assert r.content == want.choices[0].message.content, (r, want)
    assert "Paris" in r.content, r
    assert r.response_metadata["finish_reason"] == want.choices[0].finish_reason, r.response_metadata
    assert r.usage_metadata["input_tokens"] == want.usage.prompt_tokens, r.usage_metadata


def test_stream_reassembles_to_the_invoke_answer():
    llm = chat(max_tokens=16)
    whole = llm.invoke(CAPITAL)
    chunks = list(llm.stream(CAPITAL))
    assert len(chunks) > 2, chunks
    joined = chunks[0]
    for c in chunks[1:]:
        joined = joined + c
    assert joined.content == whole.content, (joined, whole)


class Capital(BaseModel):
    """The capital city of a country."""

    city: str = Field(description="the capital city", max_length=40)
    country: str = Field(description="the country", max_length=40)


def test_structured_output_by_function_calling_and_json_schema():
    q = "What is the capital of France?"
    for method in ("function_calling", "json_schema"):
        r = chat(max_tokens=80).with_structured_output(Capital, method=method).invoke(q)
        assert isinstance(r, Capital), (method, r)
        assert r.city == "Paris" and r.country, (method, r)
        print(f"        {method}: {r!r}")


def test_structured_output_in_json_mode():
    # json_mode sends response_format json_object and no schema: the prompt
    # says what to write, and the answer parses as a JSON object.
    q = "Give the capital of France as a JSON object with the keys city and country."
    r = chat(max_tokens=60).with_structured_output(method="json_mode").invoke(q)
    assert isinstance(r, dict) and r.get("city") == "Paris", r
    print(f"        json_mode: {r!r}")


def test_embeddings_are_the_official_clients():
    emb = OpenAIEmbeddings(base_url=URL, api_key="x", model=MODEL, check_embedding_ctx_length=False, max_retries=0)
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    docs = emb.embed_documents(texts)
    want = CLIENT.embeddings.create(model=MODEL, input=texts)
    assert len(docs) == 2 and len(docs[0]) == len(want.data[0].embedding) > 0, (len(docs), len(docs[0]))
    for got, w in zip(docs, want.data):
        # The same vectors (to float32 rounding, however each decodes them).
        assert max(abs(a - b) for a, b in zip(got, w.embedding)) < 1e-6
    assert emb.embed_query(texts[1]) == docs[1]


if __name__ == "__main__":
    runner.run(globals())
