"""A fault injector in front of a real S3 server (moto on loopback): an HTTP proxy in a thread that answers
chosen requests with S3's own 500 `InternalError` or 503 `SlowDown` (throttling) and passes every other
request through unchanged. It fakes nothing of S3 itself: listings and objects come from the server.

`FaultProxy(upstream, rule)`: `rule(op, key, seen)` says which fault (None: none) to give the `seen`-th
request (1-based) of this operation on this key; `op` is `list`, `get`, `head` or the HTTP method.
"""
from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

INTERNAL_ERROR, SLOW_DOWN = 500, 503
BODIES = {INTERNAL_ERROR: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
                          b"<Message>We encountered an internal error. Please try again.</Message></Error>",
          SLOW_DOWN: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                     b"<Message>Please reduce your request rate.</Message></Error>"}
Rule = Callable[[str, str, int], int | None]
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def operation(method: str, path: str) -> tuple[str, str]:
    """(op, key) of a path-style S3 request: `list` of a bucket's prefix, `get`/`head` of an object."""
    parsed = urlparse(path)
    bucket, _, key = parsed.path.lstrip("/").partition("/")
    query = parse_qs(parsed.query)
    if method == "GET" and not key and "list-type" in query:
        return "list", f"{bucket}/{query.get('prefix', [''])[0]}"
    return {"GET": "get", "HEAD": "head"}.get(method, method), f"{bucket}/{key}"


class FaultProxy:
    def __init__(self, upstream: str, rule: Rule) -> None:
        target = urlparse(upstream)
        self.host, self.port = target.hostname, target.port
        self.rule = rule
        self.seen: Counter = Counter()  # (op, key) -> requests
        self.faults: Counter = Counter()  # (op, key, status) -> faults given
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def decide(self, method: str, path: str) -> int | None:
        op, key = operation(method, path)
        with self.lock:
            self.seen[op, key] += 1
            fault = self.rule(op, key, self.seen[op, key])
            if fault is not None:
                self.faults[op, key, fault] += 1
        return fault

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy.decide(self.command, self.path)
                if fault is not None:
                    payload = b"" if self.command == "HEAD" else BODIES[fault]
                    self.send_response(fault)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(BODIES[fault])))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                    self.send_response(reply.status, reply.reason)
                    for name, value in reply.getheaders():
                        if name.lower() not in HOP_HEADERS:
                            self.send_header(name, value)
                    length = reply.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                    self.send_header("Content-Length", length or "0")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        return Handler
