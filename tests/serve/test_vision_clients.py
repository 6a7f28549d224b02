#!/usr/bin/env python3
"""onebit serve on a vision fixture (text.gguf with --mmproj mmproj.gguf:
gemma3-vision, or qwen3vl-vision), through the official `openai` client (an
image_url part with a data: URL) and the `ollama` client (`images`): the
first generated token is llama.cpp's mtmd greedy token for the same image and
prompt, the argmax of the last row of llamacpp.logits.bin, and its logprob
is llama.cpp's within the fixture's logit tolerance. A second image with the
same prompt gives other logits and reuses no cached row of the first; the
first again reuses its cached prefix and gives the same logprobs.

The fixture's prompt is mtmd's "hi<__media__>what is this ok" (gemma3 with
BOS): the server is started with a chat template that writes "hi" (after
"<bos>" for gemma3) and then each message's content without line breaks
(the OpenAI content parts [image, text] join as MARK "\\n" text; Ollama puts
the images ahead of the text), so both render as llama.cpp tokenized it; the
server puts the projector's markers (<start_of_image> / <|vision_start|>
...) around the image's rows as mtmd does.

The images are sent as PNGs made here from image.rgb (lossless, at the
encoder's native size, meta.json's: the resize is then the identity).

Usage: python3 tests/serve/test_vision_clients.py http://127.0.0.1:PORT FIXTURE_DIR
(crates/onebit/tests/serve_vision.rs starts the server and runs this.)
Prints "N passed, M failed"; exits 1 on any failure.
"""
import base64
import io
import json
import math
import os
import struct
import sys
import urllib.request

import ollama
import openai
from PIL import Image

import runner  # tests/serve/runner.py, beside this script

BASE = sys.argv[1].rstrip("/")
FIX = sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0, timeout=120)
oclient = ollama.Client(host=BASE, timeout=120)
MODEL = client.models.list().data[0].id
META = json.load(open(os.path.join(FIX, "meta.json")))
N_VOCAB = META["text_hparams"]["n_vocab"]
TEXT_AFTER = "what is this ok"  # meta.json's prompt after <__media__>
# The tokens before the image: [<bos>] "hi" and the image's begin marker (llamacpp.chunks.json).
BEFORE_IMAGE = len(json.load(open(os.path.join(FIX, "llamacpp.chunks.json")))["chunks"][0]["tokens"])
N_IMAGE = json.load(open(os.path.join(FIX, "llamacpp.chunks.json")))["chunks"][1]["n_tokens"]


def png(name):
    w, h = META["image"]["width"], META["image"]["height"]
    raw = open(os.path.join(FIX, name), "rb").read()
    assert len(raw) == w * h * 3
    buf = io.BytesIO()
    Image.frombytes("RGB", (w, h), raw).save(buf, format="PNG")
    return buf.getvalue()


def llamacpp_last_row():
    data = open(os.path.join(FIX, "llamacpp.logits.bin"), "rb").read()
    n = META["logits"]["n_text_positions"]
    assert len(data) == n * N_VOCAB * 4
    row = struct.unpack_from(f"<{N_VOCAB}f", data, (n - 1) * N_VOCAB * 4)
    return list(row)


ROW = llamacpp_last_row()
WANT = max(range(N_VOCAB), key=lambda i: ROW[i])
M = max(abs(x) for x in ROW)
LSE = max(ROW) + math.log(sum(math.exp(x - max(ROW)) for x in ROW))
WANT_LOGPROB = ROW[WANT] - LSE
# testdata/llamacpp/README.md: logits within 2e-3 x M of llama.cpp's; a
# log-softmax value moves by at most twice a logit's error.
LOGPROB_TOL = 2 * 2e-3 * M


def detok(ids):
    req = urllib.request.Request(
        BASE + "/detokenize",
        data=json.dumps({"tokens": ids}).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.load(urllib.request.urlopen(req, timeout=60))["content"]


WANT_TEXT = detok([WANT])


def openai_ask(image):
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": TEXT_AFTER},
                ],
            }
        ],
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )


FIRST = {}


def test_openai_data_url_first_token_is_mtmds():
    r = openai_ask(png("image.rgb"))
    c = r.choices[0]
    assert r.usage.prompt_tokens == META["logits"]["n_text_positions"] + N_IMAGE, r.usage
    assert c.message.content == WANT_TEXT, (c.message.content, WANT_TEXT, WANT)
    lp = c.logprobs.content[0].logprob
    assert abs(lp - WANT_LOGPROB) <= LOGPROB_TOL, (lp, WANT_LOGPROB, LOGPROB_TOL)
    FIRST["logprobs"] = [(t.token, t.logprob) for t in c.logprobs.content[0].top_logprobs]
    print(f"  token {WANT} {WANT_TEXT!r}: logprob {lp:.5f}, llama.cpp {WANT_LOGPROB:.5f}")


def test_ollama_images_first_token_is_mtmds():
    r = oclient.chat(
        model=MODEL,
        messages=[{"role": "user", "content": TEXT_AFTER, "images": [png("image.rgb")]}],
        options={"temperature": 0, "num_predict": 1},
    )
    assert r.message.content == WANT_TEXT, (r.message.content, WANT_TEXT)
    assert r.prompt_eval_count == META["logits"]["n_text_positions"] + N_IMAGE, r


def test_another_image_gives_other_logits_and_reuses_no_row_of_the_first():
    r = openai_ask(png("image2.rgb"))
    c = r.choices[0]
    other = [(t.token, t.logprob) for t in c.logprobs.content[0].top_logprobs]
    assert other != FIRST["logprobs"], other
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached <= BEFORE_IMAGE, (cached, BEFORE_IMAGE)


def test_the_first_image_again_reuses_its_prefix_and_gives_the_same_logprobs():
    r = openai_ask(png("image.rgb"))
    c = r.choices[0]
    again = [(t.token, t.logprob) for t in c.logprobs.content[0].top_logprobs]
    assert again == FIRST["logprobs"], (again, FIRST["logprobs"])
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached >= BEFORE_IMAGE + N_IMAGE, (cached, BEFORE_IMAGE + N_IMAGE)


def test_the_same_image_after_other_text_is_not_encoded_again():
    # Another message first: the prefix cache holds nothing of the image's
    # place, so its rows come from the engine's cache by the pixels' hash
    # (the Rust side checks /metrics: still two images encoded).
    r = oclient.chat(
        model=MODEL,
        messages=[
            {"role": "user", "content": "a"},
            {"role": "user", "content": TEXT_AFTER, "images": [png("image.rgb")]},
        ],
        options={"temperature": 0, "num_predict": 1},
    )
    assert r.prompt_eval_count > META["logits"]["n_text_positions"] + N_IMAGE, r


runner.run(globals())
