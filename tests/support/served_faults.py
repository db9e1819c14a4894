"""A fault injector for the served engine's tests: a stdlib HTTP server on 127.0.0.1, in a thread, that speaks
the two routes pagemill uses (`GET /v1/models`, `POST /v1/chat/completions`) and answers what a test scripts:
429, 500, 400, slowly, a completion of a test's own making (any JSON, any bytes, a huge streamed body), and
otherwise a fixed valid completion. It is not a model: the real vLLM server is tests/support/vllm_server.py's."""
from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

from schemas.extraction import load_schema
from schemas.records import PageImage, PageTask
from transforms.extract.stage import ExtractConfig
from transforms.model import budget

ANSWER = {"vendor_name": "ACME", "invoice_number": "A-1", "issue_date": "2024-01-31", "due_date": None,
          "currency": "EUR", "subtotal": 10, "tax": 2, "total": 12, "line_items": []}
SCHEMA = load_schema("invoice")
USAGE = {"prompt_tokens": 1500, "completion_tokens": 40, "total_tokens": 1540}


def config(**changes: Any) -> ExtractConfig:
    base = ExtractConfig(schema=SCHEMA, tenant="t1", model="tiny", model_revision="test", render_key="r",
                         model_family="qwen2_vl", max_model_len=8192, max_tokens=256, max_attempts=2,
                         gpu_hourly_usd=2.5, api_price="gpt-4o", prices=budget.load_prices(),
                         route="served")
    return replace(base, **changes)


def page_task(name: str, width: int = 600, height: int = 800, detail_side: int = 0, hint: str = "") -> PageTask:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (230, 230, 230)).save(buf, format="JPEG")
    page = PageImage(doc_sha256="d" * 64, source_uri=name, page_index=0, page_hash=name, image=buf.getvalue(),
                     width=width, height=height, detail_side=detail_side)
    return PageTask(page=page, cache_key=name, hint=hint)


@dataclass(frozen=True)
class Huge:
    """A 200 answer of `total` bytes, written in 64 KiB chunks (with a Content-Length when `declared`)."""

    total: int
    declared: bool = False


@dataclass
class Injector:
    """What the fault injector answers: `script` in order (status, headers, delay_s), then `then` for ever.
    A 200 answer's body is the next of `bodies` (a dict: JSON; bytes: as they are; Huge), else completion()."""

    script: list[tuple[int, dict[str, str], float]] = field(default_factory=list)
    then: tuple[int, dict[str, str], float] = (200, {}, 0.0)
    bodies: list[Any] = field(default_factory=list)
    owned_by: str = "fault-injector"
    models: tuple[int, bytes] | None = None  # GET /models's (status, body); None: a list with `tiny`
    seen: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each POST's request headers
    sent: list[int] = field(default_factory=list)  # bytes of each Huge body written before the client left
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], float, Any]:
        with self.lock:
            self.seen.append((time.monotonic(), body))
            self.headers.append(headers)
            status, extra, delay = self.script.pop(0) if self.script else self.then
            answer = (self.bodies.pop(0) if self.bodies else completion(body)) if status == 200 else None
            return status, extra, delay, answer


def completion(body: dict[str, Any], usage: dict[str, Any] | None = None, content: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content or json.dumps(ANSWER)},
                         "finish_reason": "stop"}],
            "usage": USAGE if usage is None else usage, "model": body.get("model", "tiny")}


@contextmanager
def fault_server(state: Injector, host: str = "127.0.0.1") -> Iterator[str]:
    """The injector serving on `host` (the loopback unless a test needs another of this machine's addresses);
    yields its API root (`http://HOST:PORT/v1`)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _huge(self, spec: Huge, headers: dict[str, str]) -> None:
            self.send_response(200)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            if spec.declared:
                self.send_header("Content-Length", str(spec.total))
            self.end_headers()
            chunk, sent = b"a" * 65536, 0
            try:
                self.wfile.write(b'{"choices": [{"message": {"content": "')
                while sent < spec.total:
                    self.wfile.write(chunk)
                    sent += len(chunk)
            except OSError:  # the client stopped reading and closed: what the test is about
                pass
            finally:
                with state.lock:
                    state.sent.append(sent)
                self.close_connection = True

        def do_GET(self) -> None:
            if state.models is not None:
                return self._send(*state.models, {})
            self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny", "owned_by": state.owned_by}]})
                       .encode(), {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, headers, delay, answer = state.next(body, {k.lower(): v for k, v in self.headers.items()})
            time.sleep(delay)
            if isinstance(answer, Huge):
                return self._huge(answer, headers)
            if status == 200:
                return self._send(200, answer if isinstance(answer, bytes) else json.dumps(answer).encode(), headers)
            message = "This model's maximum context length is 8192 tokens" if status == 400 else "injected"
            self._send(status, json.dumps({"error": {"message": message, "code": status}}).encode(), headers)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that gave up (the timeout and size tests) breaks the pipe: expected

    server = Server((host, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def own_address() -> str:
    """An address of this machine that is not the loopback: the one its traffic to a documentation address
    (192.0.2.1, TEST-NET-1) would leave from. A UDP connect sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        return str(s.getsockname()[0])


@contextmanager
def hang_up_server() -> Iterator[tuple[str, list[int]]]:
    """A port that accepts each connection and closes it at once, unanswered (a server dying as it is asked):
    yields its API root and a list that holds one entry per connection made."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", accepted
    finally:
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        except OSError:
            pass
        listener.close()
