#!/usr/bin/env python3
"""Issue 29's Ollama client matrix against onebit serve, each client as its
users call it (no option set to make it work): `curl -d` as Ollama's API
docs write it, the official `ollama` client, langchain-ollama and litellm's
`ollama_chat/` and `ollama/` routes; with the `options` Ollama documents,
the fields onebit does not read (the x-onebit-ignored-fields header), the
legacy /api/embeddings, llama-server's /tokenize and /detokenize and token-id
embeddings.

Usage: python3 tests/serve/test_ollama_matrix.py http://127.0.0.1:PORT
(crates/onebit/tests/serve.rs starts one server with SmolLM2-135M-Instruct,
the default, Qwen2.5-Coder-0.5B-Instruct, whose template takes tools, and
Gemma 3 270M, and runs this; the clients are installed by
scripts/python-deps.sh.) Prints "N passed, M failed"; exits 1 on any failure.

Known answers: SmolLM2 and Qwen name Paris as France's capital. The
quantization levels are the files' `general.file_type` as gguf-py reads it
(3 for SmolLM2's Q4_1 file, 15 for both Q4_K_M files), named by llama.cpp's
`enum llama_ftype` (include/llama.h).
"""
import json
import math
import subprocess
import sys

import httpx
import ollama
import runner  # tests/serve/runner.py, beside this script

BASE = sys.argv[1].rstrip("/")
CAPITAL = "What is the capital of France? Answer with one word."
client = ollama.Client(host=BASE, timeout=300)
NAMES = [m.model for m in client.list().models]
SMOL = next(n for n in NAMES if n.lower().startswith("smollm2"))
QWEN = next(n for n in NAMES if n.lower().startswith("qwen2.5-coder"))
GEMMA = next(n for n in NAMES if n.lower().startswith("gemma-3"))
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}


def post(path, body):
    return httpx.post(BASE + path, json=body, timeout=300)


def chat(options, model=None, **kw):
    body = {"model": model or SMOL, "stream": False,
            "messages": [{"role": "user", "content": kw.pop("prompt", CAPITAL)}], "options": options, **kw}
    r = post("/api/chat", body)
    assert r.status_code == 200, r.text
    return r


def curl(path, data):
    """`curl URL -d 'JSON'` exactly as Ollama's docs/api.md writes it: no
    header of ours, so curl posts it form-encoded."""
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", BASE + path, "-d", data],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    body, _, code = out.rpartition("\n")
    return int(code), body


def test_curl_as_the_ollama_docs_write_it():
    # The docs' reproducible-output request (seed and temperature 0): with
    # Ollama's default sampling the 135M model's answer is a draw, and one
    # CI run drew no "Paris".
    code, body = curl("/api/generate", '{\n  "model": "%s",\n  "prompt": "%s",\n  "stream": false,\n'
                      '  "options": {\n    "seed": 101,\n    "temperature": 0\n  }\n}' % (SMOL, CAPITAL))
    assert code == 200, body
    assert "Paris" in json.loads(body)["response"], body
    # Streamed by default: NDJSON, the last line done.
    code, body = curl("/api/chat", json.dumps({"model": SMOL, "messages": [{"role": "user", "content": CAPITAL}]}))
    lines = [json.loads(l) for l in body.splitlines()]
    assert code == 200 and lines[-1]["done"] and not lines[0]["done"], body
    code, body = curl("/api/embed", json.dumps({"model": SMOL, "input": "Why is the sky blue?"}))
    assert code == 200 and len(json.loads(body)["embeddings"][0]) == 576, body
    code, body = curl("/api/show", json.dumps({"model": SMOL}))
    assert code == 200 and json.loads(body)["details"]["quantization_level"] == "Q4_1", body
    # A body that is not JSON is a 400 in Ollama's shape, not a 415.
    code, body = curl("/api/generate", "model=x&prompt=y")
    assert code == 400 and "JSON" in json.loads(body)["error"], body


def test_quantization_level_is_the_declared_file_type():
    for name, want in ((SMOL, "Q4_1"), (QWEN, "Q4_K_M"), (GEMMA, "Q4_K_M")):
        s = client.show(name)
        assert s.details.quantization_level == want, (name, s.details)
    # /api/tags says the same of every model it has loaded.
    for m in client.list().models:
        if m.details.quantization_level:
            assert m.details.quantization_level == {SMOL: "Q4_1", QWEN: "Q4_K_M", GEMMA: "Q4_K_M"}[m.model], m


def test_capabilities_follow_the_template():
    qwen = client.show(QWEN).capabilities
    assert "completion" in qwen and "tools" in qwen and "vision" not in qwen, qwen
    # SmolLM2's own template reads no `tools`; neither template knows <think>.
    smol = client.show(SMOL).capabilities
    assert "completion" in smol and "tools" not in smol and "thinking" not in smol, smol


def test_options_all_null_are_accepted():
    # What langchain-ollama sends: every option, nearly all null.
    nulls = {k: None for k in ("mirostat", "num_ctx", "num_gpu", "num_thread", "num_predict",
                               "repeat_last_n", "repeat_penalty", "temperature", "seed", "stop",
                               "tfs_z", "top_k", "top_p", "min_p", "typical_p")}
    r = chat({**nulls, "temperature": 0})
    assert "Paris" in r.json()["message"]["content"], r.text
    assert "x-onebit-ignored-fields" not in r.headers, r.headers
    r = post("/api/embed", {"model": SMOL, "input": "hi", "options": nulls})
    assert r.status_code == 200, r.text


def test_machine_level_and_unknown_options_are_answered_and_named():
    r = chat({"temperature": 0, "num_thread": 2, "num_gpu": 0, "use_mmap": True, "mirostat": 2},
             totally_bogus_field=1)
    assert "Paris" in r.json()["message"]["content"], r.text
    named = r.headers["x-onebit-ignored-fields"].split(", ")
    assert sorted(named) == sorted(["totally_bogus_field", "options.mirostat", "options.num_thread",
                                    "options.num_gpu", "options.use_mmap"]), named
    # On /v1 too: the field not read is named, the extensions are read.
    r = post("/v1/chat/completions", {"model": SMOL, "messages": [{"role": "user", "content": CAPITAL}],
                                      "temperature": 0, "max_tokens": 8, "min_p": 0.05,
                                      "repeat_penalty": 1.0, "typical_p": 1.0, "totally_bogus_field": 1})
    assert r.status_code == 200, r.text
    assert r.headers["x-onebit-ignored-fields"] == "totally_bogus_field", r.headers


def test_repeat_penalty_is_honoured_alike_on_api_and_v1():
    prompt = "Write the word cat twenty times, separated by spaces."
    plain = chat({"temperature": 0, "num_predict": 30}, prompt=prompt).json()["message"]["content"]
    pen = chat({"temperature": 0, "num_predict": 30, "repeat_penalty": 1.5, "repeat_last_n": 64},
               prompt=prompt).json()["message"]["content"]
    # The greedy answer repeats the prompt's words ("cat twenty times"); a
    # penalty of 1.5 on them changes it, and the same request on /v1 gives
    # the same tokens.
    assert plain != pen, (plain, pen)
    v1 = post("/v1/chat/completions", {"model": SMOL, "messages": [{"role": "user", "content": prompt}],
                                       "temperature": 0, "max_tokens": 30, "repeat_penalty": 1.5,
                                       "repeat_last_n": 64}).json()
    assert v1["choices"][0]["message"]["content"] == pen, (v1, pen)


def test_min_p_one_and_a_tiny_typical_p_leave_one_candidate():
    greedy = chat({"temperature": 0, "num_predict": 12}).json()["message"]["content"]
    # min_p 1 keeps only tokens as likely as the best: the argmax, at any
    # temperature and seed.
    for seed in (1, 2):
        r = chat({"temperature": 1.5, "seed": seed, "num_predict": 12, "min_p": 1.0, "top_k": 0, "top_p": 1})
        assert r.json()["message"]["content"] == greedy, (r.text, greedy)
        v1 = post("/v1/chat/completions", {"model": SMOL, "messages": [{"role": "user", "content": CAPITAL}],
                                           "temperature": 1.5, "seed": seed, "max_tokens": 12, "min_p": 1.0})
        assert v1.json()["choices"][0]["message"]["content"] == greedy, v1.text
    # typical_p near 0 keeps the single most typical token: every seed alike.
    texts = {chat({"temperature": 1.0, "seed": s, "num_predict": 12, "typical_p": 1e-6, "top_k": 0,
                   "top_p": 1}).json()["message"]["content"] for s in (1, 2, 3)}
    assert len(texts) == 1, texts


def test_num_ctx_bounds_prompt_and_reply():
    r = post("/api/chat", {"model": SMOL, "stream": False, "options": {"num_ctx": 8},
                           "messages": [{"role": "user", "content": CAPITAL}]})
    assert r.status_code == 400 and "options.num_ctx" in r.json()["error"], r.text
    n = chat({"temperature": 0, "num_predict": 1}).json()["prompt_eval_count"]
    r = chat({"temperature": 0, "num_ctx": n + 3, "num_keep": 4}, prompt=CAPITAL).json()
    # The prompt and 3 tokens fill num_ctx: the reply ends there.
    assert r["eval_count"] == 3 and r["done_reason"] == "length", r
    r = post("/api/chat", {"model": SMOL, "stream": False, "options": {"num_ctx": 10**9},
                           "messages": [{"role": "user", "content": CAPITAL}]})
    assert r.status_code == 400 and "num_ctx" in r.json()["error"], r.text


def test_ollama_client_legacy_embeddings():
    # (The client's chat, generate, embed and tools: test_ollama_client.py.)
    legacy = client.embeddings(model=SMOL, prompt="Paris is in France.").embedding
    new = client.embed(model=SMOL, input="Paris is in France.").embeddings[0]
    assert len(legacy) == 576 and max(abs(a - b) for a, b in zip(legacy, new)) < 1e-6


def test_langchain_ollama():
    from langchain_ollama import ChatOllama, OllamaEmbeddings
    from pydantic import BaseModel
    llm = ChatOllama(model=SMOL, base_url=BASE, temperature=0, num_predict=24)
    whole = llm.invoke(CAPITAL).content
    assert "Paris" in whole, whole
    assert "".join(c.content for c in llm.stream(CAPITAL)) == whole

    class City(BaseModel):
        city: str
        country: str
    got = llm.with_structured_output(City).invoke("Name the capital of France and its country.")
    assert isinstance(got, City) and got.city and got.country, got
    # bind_tools: LangChain's tools, its call and the tool's answer in the
    # history, in Ollama's shapes; greedy SmolLM2 then calls again (through
    # the generic tool fallback: its template reads no tools), and the call
    # comes back parsed. (A fresh question on Qwen2.5-Coder gets a bare JSON
    # call, issue 29's lenient parse, another branch's.)
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    tooled = llm.bind_tools([WEATHER])
    m = tooled.invoke([HumanMessage("What is the weather in Paris?"),
                       AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "c1"}]),
                       ToolMessage("21 degrees and sunny", tool_call_id="c1", name="get_weather")])
    assert m.tool_calls and m.tool_calls[0]["name"] == "get_weather", m
    assert m.tool_calls[0]["args"] == {"city": "Paris"}, m
    emb = OllamaEmbeddings(model=SMOL, base_url=BASE)
    v = emb.embed_query("Paris is in France.")
    assert len(v) == 576 and abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5
    assert len(emb.embed_documents(["a", "b"])) == 2


def test_litellm_ollama_routes():
    import os
    # litellm fetches a price list from the web at import unless told not to
    # (no network here); that changes nothing of how it calls the server.
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm
    for route in ("ollama_chat/", "ollama/"):
        r = litellm.completion(model=route + SMOL, api_base=BASE, temperature=0, max_tokens=24,
                               messages=[{"role": "user", "content": CAPITAL}])
        assert "Paris" in r.choices[0].message.content, (route, r)


def test_tokenize_detokenize_and_token_id_embeddings():
    text = "The capital of France is Paris."
    ids = post("/tokenize", {"content": text}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids), ids
    assert post("/detokenize", {"tokens": ids}).json()["content"] == text
    # The ids embed as the text does (the text path adds what add_special adds).
    with_special = post("/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    by_text = post("/v1/embeddings", {"model": SMOL, "input": text}).json()["data"][0]["embedding"]
    for form in (with_special, [with_special]):
        r = post("/v1/embeddings", {"model": SMOL, "input": form})
        assert r.status_code == 200, r.text
        assert max(abs(a - b) for a, b in zip(r.json()["data"][0]["embedding"], by_text)) < 1e-6
    # Ids outside the vocabulary (49152 for SmolLM2) are refused by name.
    for path, body in (("/v1/embeddings", {"model": SMOL, "input": [[1, 49152]]}),
                       ("/detokenize", {"tokens": [49152]})):
        r = post(path, body)
        assert r.status_code == 400 and "49152" in r.text, (path, r.text)
        assert r.json()["error"]["param"] in ("input", "tokens"), r.text


if __name__ == "__main__":
    runner.run(globals())
