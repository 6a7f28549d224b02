#!/usr/bin/env python3
"""onebit serve's API key through the official `openai` Python client.

Usage: python3 tests/serve/test_openai_auth.py http://127.0.0.1:PORT KEY
(crates/onebit/tests/serve_safety.rs starts the server with --api-key KEY and
runs this.) Prints "N passed, M failed"; exits 1 on any failure.
"""
import sys

import openai
import runner  # tests/serve/runner.py, beside this script

BASE = sys.argv[1].rstrip("/") + "/v1"
KEY = sys.argv[2]


def client(key):
    return openai.OpenAI(base_url=BASE, api_key=key, max_retries=0, timeout=120)


def test_right_key_answers():
    c = client(KEY)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
    assert r.choices[0].message.content is not None


def test_wrong_key_is_401_in_openai_shape():
    try:
        client("not-" + KEY).models.list()
    except openai.AuthenticationError as e:
        assert e.status_code == 401
        assert e.body and e.body.get("code") == "invalid_api_key", e.body
    else:
        raise AssertionError("a wrong key was accepted")


if __name__ == "__main__":
    runner.run(globals())
