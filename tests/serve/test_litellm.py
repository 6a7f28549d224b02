#!/usr/bin/env python3
"""litellm's `openai/` route against onebit serve, unchanged: completion and
streaming, each answering as the official openai client does.

Usage: python3 tests/serve/test_litellm.py URL
URL serves SmolLM2-135M-Instruct. crates/onebit/tests/serve.rs starts it and
runs this; scripts/python-deps.sh installs litellm and openai. (With no
network litellm warns that it cannot fetch its model price list and keeps its
bundled copy; nothing here depends on it.) Prints "N passed, M failed"; exits
1 on any failure.
"""
import sys

import litellm
import openai

import runner  # tests/serve/runner.py, beside this script

URL = sys.argv[1].rstrip("/") + "/v1"
CLIENT = openai.OpenAI(base_url=URL, api_key="x", max_retries=0, timeout=120)
MODEL = CLIENT.models.list().data[0].id
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]


def official():
    return CLIENT.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12)


def ask(**kw):
    return litellm.completion(model="openai/" + MODEL, api_base=URL, api_key="x", messages=MESSAGES,
                              temperature=0, max_tokens=12, **kw)


def test_completion_gives_what_the_official_client_gives():
    r, want = ask(), official()
    assert r.choices[0].message.content == want.choices[0].message.content, (r, want)
    assert "Paris" in r.choices[0].message.content, r
    assert r.choices[0].finish_reason == want.choices[0].finish_reason, r
    assert r.usage.prompt_tokens == want.usage.prompt_tokens, r.usage


def test_streaming_reassembles_to_the_same_answer():
    pieces = [c.choices[0].delta.content or "" for c in ask(stream=True)]
    assert len([p for p in pieces if p]) > 2, pieces
    assert "".join(pieces) == official().choices[0].message.content, pieces


if __name__ == "__main__":
    runner.run(globals())
