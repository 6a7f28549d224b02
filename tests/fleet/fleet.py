"""A fleet on loopback: three `onebit serve` replicas of one model behind
HAProxy with the project's own config (deploy/haproxy/haproxy.cfg).

    python3 tests/fleet/fleet.py --onebit BIN --model MODEL.gguf

(a) 200 chat requests from 16 clients with 20 affinity keys (half sent as an
    X-Session-Id header, half as OpenAI's `user` field): every request is
    answered; all requests of a key land on one replica; a request whose key
    was already answered before it started reports cached prompt tokens.
(b) Under load, one replica gets SIGTERM: no request fails, and it exits
    within its --shutdown-timeout.
(c) Under load, one replica gets SIGKILL: every plain request is answered
    (those it held got nothing back and are retried elsewhere by the proxy);
    streams it had begun are cut, and counted.
Greedy answers through the fleet equal those of one replica asked directly.

Loopback only; every loop is bounded, and every child process is killed on
the way out. Exit status 0 when every check holds.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "deploy", "haproxy", "haproxy.cfg")
SHUTDOWN_TIMEOUT = 8
CLIENTS = 16
KEYS = 20
QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "What is two plus two?",
    "Which animal barks?",
    "What do bees make?",
    "What is frozen water called?",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "What is the opposite of hot?",
    "Which planet do we live on?",
]

children = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, headers=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def wait_until(what, check, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"FAIL: {what} not within {seconds} s")


class Replica:
    def __init__(self, name, onebit, model):
        self.name = name
        self.port = free_port()
        self.log = open(os.path.join(os.environ.get("FLEET_LOGS", "/tmp"), f"fleet-{name}-{self.port}.log"), "w")
        self.proc = subprocess.Popen(
            [onebit, "serve", "--model", model, "--port", str(self.port), "--threads", "1",
             "--max-seqs", "4", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)],
            stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        children.append(self.proc)

    def ready(self):
        if self.proc.poll() is not None:
            raise SystemExit(f"FAIL: replica {self.name} exited with status {self.proc.returncode} "
                             f"(log: {self.log.name})")
        return request(self.port, "GET", "/health", timeout=2)[0] == 200


def chat_body(key, q, user_field):
    body = {
        "messages": [
            {"role": "system", "content": f"You are helper number {key}. You answer in a few words, plainly and politely, and you never change the subject."},
            {"role": "user", "content": QUESTIONS[q]},
        ],
        "temperature": 0,
        "max_tokens": 8,
    }
    if user_field:
        body["user"] = f"key-{key}"
    return body


def affinity(key):
    """Even keys travel as a header, odd keys as the `user` field."""
    return ({"X-Session-Id": f"key-{key}"}, False) if key % 2 == 0 else ({}, True)


def one(front, i, results, lock):
    key, q = i % KEYS, (i // KEYS) % len(QUESTIONS)
    headers, user_field = affinity(key)
    start = time.time()
    try:
        status, h, raw = request(front, "POST", "/v1/chat/completions", chat_body(key, q, user_field), headers)
        v = json.loads(raw) if status == 200 else {}
    except (OSError, http.client.HTTPException) as e:
        status, h, v = f"error {type(e).__name__}", {}, {}
    end = time.time()
    row = {
        "i": i, "key": key, "q": q, "status": status, "start": start, "end": end,
        "replica": h.get("X-Onebit-Replica", h.get("x-onebit-replica")),
        "cached": v.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens"),
        "text": v.get("choices", [{}])[0].get("message", {}).get("content"),
    }
    with lock:
        results.append(row)
    return row


def load(front, ids, during=None):
    """Runs requests `ids` from CLIENTS threads; `during(results)` runs beside."""
    results, lock = [], threading.Lock()
    with ThreadPoolExecutor(CLIENTS) as pool:
        futs = [pool.submit(one, front, i, results, lock) for i in ids]
        if during:
            during(results)
        for f in futs:
            f.result(timeout=300)
    return results


def stream_one(front, key):
    """A streamed request; returns (complete, chunks) where complete means [DONE] arrived."""
    headers, user_field = affinity(key)
    body = chat_body(key, 0, user_field)
    body.update({"stream": True, "max_tokens": 48})
    c = http.client.HTTPConnection("127.0.0.1", front, timeout=120)
    chunks = 0
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers)
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=h)
        r = c.getresponse()
        if r.status != 200:
            return f"status {r.status}", chunks
        for line in r:
            if line.startswith(b"data: [DONE]"):
                return "complete", chunks
            if line.startswith(b"data: "):
                chunks += 1
        return "cut", chunks
    except (OSError, http.client.HTTPException) as e:
        return f"cut ({type(e).__name__})", chunks
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onebit", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=200)
    a = ap.parse_args()
    signal.signal(signal.SIGALRM, lambda *_: sys.exit("FAIL: the fleet test ran over 600 s"))
    signal.alarm(600)

    reps = [Replica(f"r{i + 1}", a.onebit, a.model) for i in range(3)]
    front = free_port()
    env = dict(os.environ, ONEBIT_FRONTEND=f"127.0.0.1:{front}",
               **{f"ONEBIT_R{i + 1}": f"127.0.0.1:{r.port}" for i, r in enumerate(reps)})
    check = subprocess.run(["haproxy", "-c", "-f", CONFIG], env=env, capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"FAIL: haproxy -c refused {CONFIG}:\n{check.stdout}{check.stderr}")
    hlog = open(os.path.join(os.environ.get("FLEET_LOGS", "/tmp"), f"fleet-haproxy-{front}.log"), "w")
    proxy = subprocess.Popen(["haproxy", "-db", "-f", CONFIG], env=env, stdout=hlog, stderr=hlog,
                             stdin=subprocess.DEVNULL)
    children.append(proxy)
    for r in reps:
        wait_until(f"replica {r.name} ready", r.ready, 120)
    by_port = {r.name: r for r in reps}
    # The proxy marks a replica up after two good checks.
    wait_until("the proxy answering", lambda: request(front, "GET", "/health", timeout=2)[0] == 200, 30)
    time.sleep(1.5)

    # (a) affinity and prefix-cache reuse.
    t0 = time.time()
    res = load(front, range(a.requests))
    took = time.time() - t0
    bad = [r for r in res if r["status"] != 200]
    assert not bad, f"(a) {len(bad)} requests failed: {bad[:3]}"
    placement = {}
    for r in res:
        placement.setdefault(r["key"], set()).add(r["replica"])
    split = {k: v for k, v in placement.items() if len(v) != 1}
    assert not split, f"(a) keys served by several replicas: {split}"
    used = sorted({next(iter(v)) for v in placement.values()})
    assert len(used) >= 2, f"(a) the 20 keys all hashed to {used}: no balancing"
    cold = []
    for r in res:
        earlier = [o for o in res if o["key"] == r["key"] and o["end"] < r["start"]]
        if earlier and not r["cached"]:
            cold.append(r)
    assert not cold, f"(a) {len(cold)} repeat-key requests reported no cached tokens: {cold[:3]}"
    repeats = sum(1 for r in res if any(o["key"] == r["key"] and o["end"] < r["start"] for o in res))
    print(f"(a) {len(res)} requests from {CLIENTS} clients, {KEYS} keys, in {took:.1f} s: all 200; "
          f"keys per replica {dict((n, sum(1 for v in placement.values() if n in v)) for n in used)}; "
          f"{repeats} repeat-key requests, all with cached_tokens > 0")

    # Greedy answers through the fleet equal one replica asked directly.
    # Two prompts per key (40), asked of r1 alone, compared with every fleet
    # answer to the same prompt.
    direct = {}
    for key, q in sorted({(r["key"], r["q"]) for r in res if r["q"] < 2}):
        headers, user_field = affinity(key)
        status, _, raw = request(reps[0].port, "POST", "/v1/chat/completions", chat_body(key, q, user_field))
        assert status == 200, raw
        direct[(key, q)] = json.loads(raw)["choices"][0]["message"]["content"]
    compared = [r for r in res if (r["key"], r["q"]) in direct]
    differ = [r for r in compared if r["text"] != direct[(r["key"], r["q"])]]
    assert compared and not differ, f"fleet answers differ from one replica's: {differ[:3]}"
    print(f"greedy: {len(compared)} fleet answers equal replica r1's direct answers "
          f"to the same {len(direct)} prompts")

    # (b) SIGTERM one replica under load: nothing fails, it exits in time.
    victim = by_port[max(used, key=lambda n: sum(1 for v in placement.values() if n in v))]
    term = {}

    def sigterm(results):
        wait_until("20 answers before SIGTERM", lambda: len(results) >= 20, 120)
        term["at"] = time.time()
        victim.proc.send_signal(signal.SIGTERM)
        try:
            victim.proc.wait(timeout=SHUTDOWN_TIMEOUT + 5)
        except subprocess.TimeoutExpired:
            pass
        term["exited"] = victim.proc.poll()
        term["took"] = time.time() - term["at"]

    res_b = load(front, range(1000, 1080), during=sigterm)
    bad = [r for r in res_b if r["status"] != 200]
    assert not bad, f"(b) {len(bad)} requests failed during the SIGTERM drain: {bad[:3]}"
    assert term["exited"] is not None, f"(b) {victim.name} still running {SHUTDOWN_TIMEOUT + 5} s after SIGTERM"
    assert term["took"] <= SHUTDOWN_TIMEOUT + 2, f"(b) {victim.name} took {term['took']:.1f} s to exit"
    after = [r for r in res_b if r["start"] > term["at"] + 1.0]
    on_victim = [r for r in after if r["replica"] == victim.name]
    assert not on_victim, f"(b) requests started after the drain began went to {victim.name}: {on_victim[:3]}"
    print(f"(b) SIGTERM to {victim.name} under load: {len(res_b)} requests all 200 "
          f"({sum(1 for r in res_b if r['replica'] == victim.name)} on {victim.name}, "
          f"{len(after)} started after it, none sent to it); it exited after {term['took']:.1f} s "
          f"(timeout {SHUTDOWN_TIMEOUT:.0f} s), status {term['exited']}")

    # (c) SIGKILL one of the two left, under load with streams.
    left = [r for r in reps if r is not victim]
    killed = left[0]
    kill = {}
    stream_results = []

    def sigkill(results):
        wait_until("15 answers before SIGKILL", lambda: len(results) >= 15, 120)
        with ThreadPoolExecutor(4) as sp:
            sf = [sp.submit(stream_one, front, k) for k in range(KEYS)]
            time.sleep(0.3)
            kill["at"] = time.time()
            killed.proc.kill()
            killed.proc.wait(timeout=10)
            stream_results.extend(f.result(timeout=300) for f in sf)

    res_c = load(front, range(2000, 2080), during=sigkill)
    # A plain request gets nothing back from a killed replica, so the proxy
    # runs it on another one: every plain request is answered. A stream
    # that had begun on the killed replica is cut, and only those.
    failed = [r for r in res_c if r["status"] != 200]
    assert not failed, f"(c) plain requests failed after the SIGKILL: {failed[:3]}"
    cut = [s for s in stream_results if s[0] != "complete"]
    assert len(cut) < len(stream_results), f"(c) every stream was cut: {cut}"
    print(f"(c) SIGKILL to {killed.name} under load: {len(res_c)}/{len(res_c)} plain requests answered "
          f"(those it held were retried on the others); streams: "
          f"{len(stream_results) - len(cut)}/{len(stream_results)} complete, {len(cut)} cut, as clients saw "
          f"them: {[c[0] + f' after {c[1]} data chunks, no [DONE]' for c in cut]}")
    print("fleet: every check held")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
        for p in children:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
