#!/usr/bin/env python3
"""onebit serve through the official `openai` Python client.

Usage: python3 tests/serve/test_openai_client.py http://127.0.0.1:PORT
(crates/onebit/tests/serve.rs starts the server and runs this; the client is
installed by scripts/python-deps.sh.) Prints "N passed, M failed"; exits 1 on
any failure.
"""
import sys

import openai
import runner  # tests/serve/runner.py, beside this script

BASE = sys.argv[1].rstrip("/") + "/v1"
client = openai.OpenAI(base_url=BASE, api_key="not-needed", max_retries=0, timeout=120)
CAPITAL = "What is the capital of France? Answer with one word."
MODEL = None


def ask(**kw):
    args = dict(model=MODEL, messages=[{"role": "user", "content": CAPITAL}], temperature=0, max_tokens=24)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_models():
    global MODEL
    models = client.models.list().data
    assert len(models) == 1, models
    MODEL = models[0].id
    assert MODEL.startswith("SmolLM2"), MODEL


def test_known_answer_and_identical_repeats():
    r = ask()
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert "<|im_end|>" not in text
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    again = [ask().choices[0].message.content for _ in range(2)]
    assert again == [text, text], (text, again)


def test_stream_matches_whole_and_ends_with_usage():
    whole = ask().choices[0].message.content
    chunks = list(ask(stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole, (text, whole)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, chunks[-1]
    assert chunks[-1].usage.completion_tokens > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"], finishes


def test_logprobs_greedy_choice_is_the_top():
    r = ask(max_tokens=8, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert content
    for t in content:
        assert len(t.top_logprobs) == 4
        assert t.logprob == max(x.logprob for x in t.top_logprobs), t
        assert t.token == t.top_logprobs[0].token


def test_completions_endpoint():
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert "Paris" in r.choices[0].text, r
    assert r.choices[0].finish_reason in ("stop", "length")


def test_sampling_with_seed_is_reproducible_and_n_choices():
    kw = dict(temperature=0.9, top_p=0.95, seed=1234, max_tokens=12, n=2)
    a = ask(**kw)
    b = ask(**kw)
    assert len(a.choices) == 2
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]


def test_bad_requests_raise_400():
    for kw in (dict(messages=[]), dict(max_tokens=0), dict(messages=[{"role": "wizard", "content": "x"}])):
        try:
            ask(**kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400
            assert e.body and e.body.get("message"), e.body
        else:
            raise AssertionError(f"{kw} was accepted")


if __name__ == "__main__":
    runner.run(globals())
