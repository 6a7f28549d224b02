"""A local stand-in for the Hugging Face Hub, for onebit's pull tests.

Serves ROOT/ORG/REPO/** (symlinks followed) in the Hub's URL layout:

  GET  /api/models/ORG/REPO[/revision/REV][?blobs=true]   model info: sha, siblings
  HEAD|GET /ORG/REPO/resolve/REV/FILE                      the file's headers
        LFS file: 302 to /cdn/... with X-Repo-Commit, X-Linked-Etag (sha256),
                  X-Linked-Size, ETag (the pointer's blob id)
        small file: 200 with ETag (git blob SHA-1), X-Repo-Commit, the bytes
  GET  /cdn/ORG/REPO/FILE                                  the bytes; Range honoured
  GET  /_log                                               requests seen (JSON)

Faults and gates come from ROOT/ORG/REPO.hub.json (beside the repository,
so not one of its files):
  {"gated": "TOKEN"}        resolve answers 401 without `Authorization: Bearer TOKEN`
  {"cut_once": ["FILE"]}    the first transfer of FILE from byte 0 stops halfway
  {"corrupt": ["FILE"]}     FILE's bytes are served with one byte changed
                            (its headers keep the true sha256)
  {"chunk_delay_ms": N}     a pause after each 64 KiB sent (to overlap pulls)

A file is LFS when its name ends in .gguf, .q4nx, .bin or .safetensors, or it
holds 1 MiB or more (the Hub decides by .gitattributes; this rule is ours).
Prints `listening on http://127.0.0.1:PORT` once it serves.
"""

import hashlib
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".gguf", ".q4nx", ".bin", ".safetensors")
CHUNK = 64 * 1024


class Hub:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.lock = threading.Lock()
        self.log = []
        self.hashes = {}
        self.cut_done = set()

    def repo_dir(self, repo):
        parts = repo.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") for p in parts):
            return None
        d = os.path.join(self.root, *parts)
        return d if os.path.isdir(d) else None

    def config(self, repo):
        p = os.path.join(self.root, repo + ".hub.json")
        if os.path.isfile(p):
            with open(p) as f:
                return json.load(f)
        return {}

    def files(self, repo):
        d = self.repo_dir(repo)
        out = []
        for base, dirs, names in os.walk(d, followlinks=True):
            dirs.sort()
            for n in sorted(names):
                full = os.path.join(base, n)
                out.append(os.path.relpath(full, d).replace(os.sep, "/"))
        return sorted(out)

    def facts(self, repo, name):
        """(size, git blob sha1, sha256 or None when not LFS)."""
        path = os.path.join(self.repo_dir(repo), name)
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        with self.lock:
            if key in self.hashes:
                return self.hashes[key]
        h1 = hashlib.sha1(b"blob %d\0" % st.st_size)
        h256 = hashlib.sha256()
        with open(path, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                h1.update(b)
                h256.update(b)
        lfs = name.endswith(LFS_SUFFIXES) or st.st_size >= (1 << 20)
        if lfs:
            # The git blob of an LFS file is its pointer, not its bytes.
            pointer = (
                "version https://git-lfs.github.com/spec/v1\n"
                f"oid sha256:{h256.hexdigest()}\nsize {st.st_size}\n"
            ).encode()
            blob = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
            v = (st.st_size, blob, h256.hexdigest())
        else:
            v = (st.st_size, h1.hexdigest(), None)
        with self.lock:
            self.hashes[key] = v
        return v

    def commit(self, repo):
        h = hashlib.sha1()
        for n in self.files(repo):
            size, blob, sha = self.facts(repo, n)
            h.update(f"{n}\0{blob}\0".encode())
        return h.hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None

    def log_message(self, fmt, *args):
        pass

    def record(self):
        with self.hub.lock:
            self.hub.log.append(
                {
                    "method": self.command,
                    "path": urllib.parse.urlsplit(self.path).path,
                    "range": self.headers.get("Range"),
                    "auth": self.headers.get("Authorization") is not None,
                }
            )

    def send(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, msg):
        self.send(
            status,
            json.dumps({"error": msg}).encode(),
            {"X-Error-Code": code, "X-Error-Message": msg},
        )

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        self.record()
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        try:
            if parts == ["_log"]:
                with self.hub.lock:
                    body = json.dumps(self.hub.log).encode()
                return self.send(200, body)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self.info(parts[2] + "/" + parts[3], parts[4:])
            if parts and parts[0] == "cdn" and len(parts) >= 4:
                return self.bytes_of(parts[1] + "/" + parts[2], "/".join(parts[3:]))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
        except (BrokenPipeError, ConnectionResetError):
            return
        self.error(404, "EntryNotFound", f"no route {url.path}")

    def info(self, repo, rest):
        if self.hub.repo_dir(repo) is None:
            return self.error(404, "RepoNotFound", f"Repository {repo} not found")
        if rest and not (len(rest) == 2 and rest[0] == "revision" and rest[1] in ("main", self.hub.commit(repo))):
            return self.error(404, "RevisionNotFound", f"revision {'/'.join(rest)} not found")
        sibs = []
        for n in self.hub.files(repo):
            size, blob, sha = self.hub.facts(repo, n)
            s = {"rfilename": n, "size": size, "blobId": blob}
            if sha:
                s["lfs"] = {"sha256": sha, "size": size, "pointerSize": 134}
            sibs.append(s)
        cfg = self.hub.config(repo)
        body = {
            "_id": repo,
            "id": repo,
            "modelId": repo,
            "sha": self.hub.commit(repo),
            "private": False,
            "gated": "manual" if cfg.get("gated") else False,
            "siblings": sibs,
        }
        self.send(200, json.dumps(body).encode())

    def resolve(self, repo, rev, name):
        if self.hub.repo_dir(repo) is None:
            return self.error(404, "RepoNotFound", f"Repository {repo} not found")
        cfg = self.hub.config(repo)
        token = cfg.get("gated")
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            return self.error(
                401, "GatedRepo", f"Access to model {repo} is restricted. You must have access to it and be authenticated to access it. Please log in."
            )
        commit = self.hub.commit(repo)
        if rev not in ("main", commit):
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if name not in self.hub.files(repo):
            return self.error(404, "EntryNotFound", f"{name} does not exist on {rev}")
        size, blob, sha = self.hub.facts(repo, name)
        if sha:
            host = self.headers.get("Host")
            loc = f"http://{host}/cdn/{repo}/{urllib.parse.quote(name)}"
            return self.send(
                302,
                b"",
                {
                    "Location": loc,
                    "X-Repo-Commit": commit,
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(size),
                    "ETag": f'"{blob}"',
                },
            )
        self.serve_file(repo, name, size, {"ETag": f'"{blob}"', "X-Repo-Commit": commit})

    def bytes_of(self, repo, name):
        if self.hub.repo_dir(repo) is None or name not in self.hub.files(repo):
            return self.error(404, "EntryNotFound", f"{repo}/{name}")
        size, blob, sha = self.hub.facts(repo, name)
        self.serve_file(repo, name, size, {"ETag": f'"{sha}"'})

    def serve_file(self, repo, name, size, headers):
        cfg = self.hub.config(repo)
        start = 0
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes=") and rng[6:].endswith("-"):
            start = int(rng[6:-1])
            if start >= size:
                return self.send(416, b"", {"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        stop = size
        key = (repo, name)
        if name in cfg.get("cut_once", []) and start == 0:
            with self.hub.lock:
                if key not in self.hub.cut_done:
                    self.hub.cut_done.add(key)
                    stop = size // 2
        corrupt_at = size // 2 if name in cfg.get("corrupt", []) else -1
        delay = cfg.get("chunk_delay_ms", 0) / 1000.0
        with open(os.path.join(self.hub.repo_dir(repo), name), "rb") as f:
            f.seek(start)
            pos = start
            while pos < stop:
                b = bytearray(f.read(min(CHUNK, stop - pos)))
                if not b:
                    break
                if pos <= corrupt_at < pos + len(b):
                    b[corrupt_at - pos] ^= 0xFF
                self.wfile.write(b)
                pos += len(b)
                if delay:
                    time.sleep(delay)
        if stop < size:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)


def main():
    root = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    Handler.hub = Hub(root)
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    print(f"listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
