"""servefix.py — a live `pi2 serve` for the server tests: started as a subprocess on 127.0.0.1 and a free port
(--port 0: the port it prints), waited for on /health, stopped with Ctrl-C (SIGINT) at the end."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request


class LiveServer:
    def __init__(self, model, *args, env=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "pi2", "serve", str(model), "--host", "127.0.0.1",
                                      "--port", "0", *args], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, **(env or {})})
        self.lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("pi2 serve exited: " + "".join(self.lines))
            self.lines.append(line)
            m = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}"
                break
        else:
            raise RuntimeError("pi2 serve did not start")
        for _ in range(100):
            try:
                if self.get("/health")["status"] == "ok":
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("pi2 serve does not answer /health")

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def stop(self) -> tuple:
        """Ctrl-C: (exit status, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, "".join(self.lines) + err
