"""hubstandin.py — a local stand-in for the Hugging Face hub for the `pi2 pull` tests (CI has no internet): the model
info API (/api/models/REPO/revision/REV?blobs=true, with LFS sizes and SHA-256s) and file downloads
(/REPO/resolve/REV/FILE, with Range requests), on 127.0.0.1 and a free port. Faults on demand: a download cut after
some bytes (the client sees a short read), a wrong SHA-256 in the listing.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """repos: {repo_id: {filename: bytes or a path's bytes}}; cut: {filename: bytes sent before the connection
    drops (once)}; bad_sha: filenames listed with a wrong SHA-256. ranges records each download's Range header."""

    def __init__(self, repos: dict):
        self.repos, self.cut, self.bad_sha, self.ranges = repos, {}, set(), []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                hub._get(self, body=True)

            def do_HEAD(self):
                hub._get(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _json(self, h, status: int, obj, headers=None):
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _get(self, h, body: bool):
        path = h.path.split("?")[0]
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            files = self.repos.get(m.group(1))
            if files is None:
                return self._json(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            sibs = []
            for name, data in files.items():
                sha = hashlib.sha256(data).hexdigest()
                if name in self.bad_sha:
                    sha = hashlib.sha256(b"not " + data).hexdigest()
                sibs.append({"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                             "lfs": {"size": len(data), "sha256": sha, "pointerSize": 134}})
            return self._json(h, 200, {"id": m.group(1), "sha": COMMIT, "siblings": sibs})
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        files = self.repos.get(m.group(1)) if m else None
        if files is None or m.group(3) not in files:
            return self._json(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        name, data = m.group(3), files[m.group(3)]
        rng = h.headers.get("Range")
        if body:
            self.ranges.append((name, rng))
        start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)) if rng else 0
        h.send_response(206 if rng else 200)
        h.send_header("Content-Length", str(len(data) - start))
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if not body:
            return
        end = len(data)
        if name in self.cut:
            end = min(end, start + self.cut.pop(name))
            h.close_connection = True
        h.wfile.write(data[start:end])
        h.wfile.flush()
