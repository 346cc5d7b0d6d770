"""main.py — serve(): pi2 serve's process: the listening socket (one-line errors for a port in use or an unknown
host), the model opened with pi2.load, its slots (slots.py) and endpoints (app.py) run by uvicorn until Ctrl-C;
at shutdown the routing of experts streamed from a MoE file goes to its routing profile (as `pi2 run`'s).
"""
from __future__ import annotations

import socket
import sys
from typing import Optional

import uvicorn

from pi2.api import load
from pi2.errors import Pi2Error, UsageError
from pi2.runtime.session import keep_routing
from pi2.serve.app import Server
from pi2.serve.slots import Slots

# The engine thread wants the GIL back the moment a decode returns; Python's default switch interval (5 ms) lets
# the HTTP thread hold it for up to most of a small model's token. 0.5 ms: +6 % streamed tokens/s on SmolLM2
# (two interleaved A/B rounds, -t 2, AMD EPYC, 2 cores).
SWITCH_S = 0.0005

# A stream writes the pieces decoded since its last write, then waits this long before the next write (its first
# piece goes out at once). Each write costs the event loop, uvicorn and the client ~0.3 ms of CPU, which on a phone's
# few cores is taken from the decode threads: a small model's every token would lose ~10 %. 20 ms is below what a
# reader sees (a 60 Hz screen shows a frame every 17 ms) and leaves a model slower than 50 tokens/s one write a token.
STREAM_INTERVAL_MS = 20.0


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line error (address in use, no such host)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"invalid --port {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"cannot resolve --host {host}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise Pi2Error(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    return sock


def serve(model_path, *, host: str = "127.0.0.1", port: int = 8080, api_key: Optional[str] = None,
          n_parallel: int = 1, max_queue: int = 64, max_body: int = 8 << 20, chat_template: Optional[str] = None,
          batched: bool = True, stream_interval_ms: float = STREAM_INTERVAL_MS, **options) -> None:
    """Serve `model_path` until interrupted (KeyboardInterrupt propagates: the CLI exits 130). options: pi2.load's."""
    if n_parallel < 1:
        raise UsageError(f"invalid --parallel {n_parallel}: at least 1 slot")
    if max_queue < 0:
        raise UsageError(f"invalid --queue {max_queue}")
    if not 0 <= stream_interval_ms <= 1000:
        raise UsageError(f"invalid --stream-interval {stream_interval_ms:g}: 0 to 1000 ms")
    sys.setswitchinterval(SWITCH_S)
    sock = bind(host, port)
    try:
        model = load(model_path, chat_template=chat_template, **options)
        if model.template_fallback:     # llama-server's behaviour: warn, then use ChatML
            print("pi2: warning: the model has no chat template (tokenizer.chat_template); chat uses ChatML",
                  file=sys.stderr)
        slots = Slots(model, n_parallel, max_queue, batched).start()
        server = Server(slots, api_key, max_body, stream_interval_ms / 1e3)
        config = uvicorn.Config(server.app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                                lifespan="off")
        shown = f"[{host}]" if ":" in host else host
        print(f"pi2: serving {model.name} on http://{shown}:{sock.getsockname()[1]} ({n_parallel} slot"
              f"{'s' if n_parallel > 1 else ''}, context {model.n_ctx} each)", file=sys.stderr, flush=True)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            slots.stop()
            keep_routing(*(s.seq.session for s in slots.slots))   # streamed experts: routing kept, as pi2 run does
    finally:
        sock.close()
    raise KeyboardInterrupt     # uvicorn returns after SIGINT / SIGTERM: the CLI's exit 130
