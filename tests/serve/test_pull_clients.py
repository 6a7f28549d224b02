#!/usr/bin/env python3
"""onebit serve's model store through the official clients: the `ollama`
client's pull (streamed and not), list, ps and delete, and the `openai`
client's models.list and models.retrieve, against a server whose HF_ENDPOINT
is the stand-in Hub (tests/hub/hub.py).

Usage: python3 tests/serve/test_pull_clients.py http://127.0.0.1:PORT NAME DEFAULT
(crates/onebit/tests/pull.rs starts the Hub with SmolLM2 under NAME and the
server on the same file as DEFAULT, and runs this.) Prints
"N passed, M failed"; exits 1 on any failure.
"""
import sys

import ollama
import openai
import runner  # tests/serve/runner.py, beside this script

URL, NAME, DEFAULT = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
client = ollama.Client(host=URL, timeout=120)
oai = openai.OpenAI(base_url=URL + "/v1", api_key="none")
GREEDY = {"temperature": 0, "num_predict": 12}
QUESTION = [{"role": "user", "content": "What is the capital of France? One word."}]


def names():
    return [m.model for m in client.list().models]


def test_pull_streams_progress_in_ollamas_shape_then_serves_the_model():
    assert NAME not in names(), names()
    steps = list(client.pull(NAME, stream=True))
    statuses = [s.status for s in steps]
    assert statuses[0] == "pulling manifest", statuses
    assert statuses[-1] == "success", statuses
    files = [s for s in steps if s.digest]
    assert files, statuses
    last = files[-1]
    assert last.digest.startswith("sha256:") and len(last.digest) == 7 + 64, last
    assert last.completed == last.total and last.total > 50_000_000, last
    assert NAME in names() and DEFAULT in names(), names()


def test_a_pulled_model_answers_as_the_same_file_served_by_path():
    pulled = client.chat(model=NAME, messages=QUESTION, options=GREEDY)
    by_path = client.chat(model=DEFAULT, messages=QUESTION, options=GREEDY)
    assert pulled.message.content == by_path.message.content, (pulled, by_path)
    loaded = [m.model for m in client.ps().models]
    assert NAME in loaded, loaded


def test_pull_again_without_stream_says_success():
    r = client.pull(NAME, stream=False)
    assert r.status == "success", r


def test_openai_models_list_and_retrieve_know_the_pulled_model():
    ids = [m.id for m in oai.models.list().data]
    assert NAME in ids and DEFAULT in ids, ids
    m = oai.models.retrieve(NAME)
    assert m.id == NAME, m


def test_a_wrong_quant_is_a_404_naming_the_quants():
    repo = NAME.rsplit(":", 1)[0]
    try:
        client.pull(repo + ":Q2_K", stream=False)
        raise AssertionError("pull of a missing quant succeeded")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e
        assert "its quants: Q4_1" in e.error, e.error


def test_delete_removes_it_from_the_server_and_the_store():
    client.delete(NAME)
    assert NAME not in names(), names()
    try:
        client.delete(NAME)
        raise AssertionError("a second delete succeeded")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e
    try:
        client.chat(model=NAME, messages=QUESTION, options=GREEDY)
        raise AssertionError("a deleted model answered")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e


runner.run(globals())
