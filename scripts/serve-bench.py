#!/usr/bin/env python3
"""Serving load: N streaming chat clients against one OpenAI-compatible server.

    scripts/serve-bench.py --url http://127.0.0.1:8080 --clients 8 [--requests 2]
                           [--max-tokens 64] [--model NAME] [--json]

Each client sends --requests streamed /v1/chat/completions requests one after
the other (temperature 0, max_tokens --max-tokens, each client its own
question so no two share more than the chat template's prefix), all clients
at once. For every request it records the time to the first content token
(from sending the request) and the tokens generated (the usage of the final
chunk, asked with stream_options.include_usage; the content chunks counted
when a server sends no usage). It prints the aggregate generation throughput
(all tokens over the wall time from the first request to the last answer),
the per-request decode rate, the time to first token (median and p90) and
how many requests failed or came back cut (a request is lost when it gets no
200, no [DONE], or fewer tokens than max_tokens without finish_reason stop).

Invariant: every number printed is measured from the client side over HTTP,
the same way for any server; nothing is read from the server's own stats.
Standard library only (threads and http.client), so it runs against onebit
serve and llama-server alike (scripts/bench-serve.sh runs both).
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from urllib.parse import urlparse

TOPICS = [
    "the history of the printing press", "how bridges carry their load", "the water cycle",
    "why the sky is blue", "how a compiler works", "the life of honey bees", "how vaccines work",
    "the rules of chess", "how glass is made", "the causes of the seasons", "how a bicycle stays up",
    "the invention of the telephone", "how coral reefs form", "what makes bread rise",
    "how a refrigerator works", "the migration of birds", "how tides work", "the structure of an atom",
    "how a violin makes sound", "how maps are drawn", "the history of the calendar",
    "how rainbows form", "how a lock and key work", "the growth of a tree", "how clouds form",
    "how a camera lens focuses", "the story of paper money", "how volcanoes erupt",
    "how a sailboat sails upwind", "how the heart pumps blood", "how wind turbines work",
    "the making of cheese",
]


def one_request(url, model, client, i, max_tokens, timeout):
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    topic = TOPICS[(client * 7 + i) % len(TOPICS)]
    body = {
        "messages": [{"role": "user", "content": f"Explain {topic} in detail, step by step. (client {client}, request {i})"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    rec = {"ok": False, "ttft": None, "tokens": 0, "finish": None, "t0": t0, "t1": None, "error": None}
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return rec
        chunks = 0
        usage = None
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("content"):
                    chunks += 1
                    if rec["ttft"] is None:
                        rec["ttft"] = time.perf_counter() - t0
                if ch.get("finish_reason"):
                    rec["finish"] = ch["finish_reason"]
        rec["t1"] = time.perf_counter()
        rec["tokens"] = usage["completion_tokens"] if usage and "completion_tokens" in usage else chunks
        full = rec["tokens"] >= max_tokens or rec["finish"] == "stop"
        rec["ok"] = done and full and rec["ttft"] is not None
        if not rec["ok"]:
            rec["error"] = f"done={done} tokens={rec['tokens']} finish={rec['finish']}"
    except Exception as e:  # a lost request is counted, not raised
        rec["error"] = repr(e)
    finally:
        conn.close()
    return rec


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default="")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.clients < 1 or a.requests < 1 or a.max_tokens < 1:
        ap.error("--clients, --requests and --max-tokens must be at least 1")

    results = []
    lock = threading.Lock()

    def client(c):
        for i in range(a.requests):
            r = one_request(a.url, a.model, c, i, a.max_tokens, a.timeout)
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start

    ok = [r for r in results if r["ok"]]
    tokens = sum(r["tokens"] for r in ok)
    ttfts = [r["ttft"] for r in ok]
    rates = [(r["tokens"] - 1) / (r["t1"] - r["t0"] - r["ttft"]) for r in ok
             if r["tokens"] > 1 and r["t1"] - r["t0"] > r["ttft"]]
    out = {
        "clients": a.clients,
        "requests": len(results),
        "lost": len(results) - len(ok),
        "tokens": tokens,
        "wall_s": wall,
        "throughput_tps": tokens / wall if wall > 0 else 0.0,
        "ttft_median_s": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p90_s": pct(ttfts, 0.9),
        "per_request_decode_tps": statistics.median(rates) if rates else float("nan"),
        "errors": sorted({r["error"] for r in results if r["error"]})[:5],
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{a.clients} clients x {a.requests} requests: {out['throughput_tps']:.1f} tok/s aggregate, "
              f"{out['per_request_decode_tps']:.1f} tok/s per request, ttft median {out['ttft_median_s']:.2f} s "
              f"p90 {out['ttft_p90_s']:.2f} s, {out['lost']} lost of {out['requests']}")
        for e in out["errors"]:
            print(f"  error: {e}", file=sys.stderr)
    sys.exit(1 if out["lost"] else 0)


if __name__ == "__main__":
    main()
