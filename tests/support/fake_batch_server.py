"""A fake of OpenAI's Batch API for the batch engine's tests: a stdlib HTTP server on 127.0.0.1, in a thread, with
the files endpoints (upload, content) and the batches endpoints (create, get, list with metadata and paging,
cancel) and `GET /v1/models`. It is not a model: a batch moves only when the test says (`run`: validating ->
in_progress -> finalizing -> completed, `expire` with a share of its requests answered, `fail`, `cancel`), and
each request is answered with `answer(body)` (by default a valid invoice) and usage counts derived from the
request, which the server adds up as what it billed. Faults: a 429 on the next creates, a 500 on the next
downloads, request-level errors (`errors_for`). It counts every custom_id it ever received (`received`).
"""
from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import fake_anthropic_batches as anthropic
from tests.support.served_faults import ANSWER

CHUNK = 16 * 1024  # the server writes file content in pieces this big (a results file spans many reads)


def answer_invoice(body: dict[str, Any]) -> str:
    return json.dumps(ANSWER)


def usage_of(body: dict[str, Any], content: str) -> dict[str, int]:
    """Billed tokens of one request, derived from the request and the answer (not a constant)."""
    prompt = len(json.dumps(body["messages"])) // 50 + 100
    completion = max(1, len(content) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass
class FakeBatches:
    model: str = "gpt-4o"
    answer: Callable[[dict[str, Any]], str] = answer_invoice
    files: dict[str, bytes] = field(default_factory=dict)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: Counter[str] = field(default_factory=Counter)  # custom_id -> how many times it was submitted
    billed: Counter[str] = field(default_factory=Counter)  # prompt_tokens, completion_tokens of answers returned
    creates_429: int = 0  # the next creates answer 429
    key: str | None = None  # Anthropic's routes: the x-api-key they want (None: any)
    ends_at_create: bool = False  # every batch runs to completion right after its create (a quick provider)
    downloads_500: int = 0  # the next downloads answer 500
    errors_for: set[str] = field(default_factory=set)  # custom_ids answered with a request-level error (HTTP 400)
    calls: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):05d}"

    def requests(self, batch_id: str) -> list[dict[str, Any]]:
        """A batch's requests as OpenAI's lines (an Anthropic batch's: custom_id and its params as `body`)."""
        if self.batches[batch_id].get("api") == "anthropic":
            return [{"custom_id": r["custom_id"], "body": r["params"]} for r in self.batches[batch_id]["_requests"]]
        data = self.files[self.batches[batch_id]["input_file_id"]]
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def working(self) -> list[str]:
        return [b["id"] for b in self.batches.values() if b.get("status", b.get("processing_status")) in (
            "validating", "in_progress", "finalizing", "canceling")]

    def start(self, batch_id: str, status: str = "in_progress") -> None:
        with self.lock:
            self.batches[batch_id]["status"] = status

    def run(self, batch_id: str, share: float = 1.0, status: str = "completed") -> None:
        """End a batch: the first `share` of its requests answered (or errored), the rest missing from the
        output (an expired batch's unrun requests go to the error file as `batch_expired`)."""
        with self.lock:
            batch = self.batches[batch_id]
            lines = self.requests(batch_id)
            done = lines[:int(len(lines) * share)]
            if batch.get("api") == "anthropic":
                return anthropic.run(self, batch, done, lines[len(done):], status)
            out, err = [], []
            for line in done:
                cid, body = line["custom_id"], line["body"]
                if cid in self.errors_for:
                    err.append({"id": self._id("req"), "custom_id": cid, "error": None, "response": {
                        "status_code": 400, "body": {"error": {"message": "bad request", "type": "invalid"}}}})
                    continue
                content = self.answer(body)
                usage = usage_of(body, content)
                self.billed.update({k: usage[k] for k in ("prompt_tokens", "completion_tokens")})
                out.append({"id": self._id("req"), "custom_id": cid, "error": None, "response": {
                    "status_code": 200, "request_id": self._id("r"), "body": {
                        "id": self._id("chatcmpl"), "object": "chat.completion", "model": self.model,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": usage}}})
            if status == "expired":
                err += [{"id": self._id("req"), "custom_id": line["custom_id"], "response": None,
                         "error": {"code": "batch_expired", "message": "This request could not be executed "
                                   "before the completion window expired."}} for line in lines[len(done):]]
            batch["status"] = status
            batch["request_counts"] = {"total": len(lines), "completed": len(out), "failed": len(lines) - len(out)}
            if out:
                batch["output_file_id"] = self._store(out)
            if err:
                batch["error_file_id"] = self._store(err)

    def fail(self, batch_id: str) -> None:
        """A batch that failed validation: no output at all."""
        with self.lock:
            batch = self.batches[batch_id]
            batch["status"] = "failed"
            batch["errors"] = {"object": "list", "data": [{"code": "invalid_file", "message": "validation failed"}]}

    def _store(self, lines: list[dict[str, Any]]) -> str:
        file_id = self._id("file")
        self.files[file_id] = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        return file_id

    def billed_usd(self, input_per_mtok: float, output_per_mtok: float, rate: float) -> float:
        return (self.billed["prompt_tokens"] * input_per_mtok + self.billed["completion_tokens"] * output_per_mtok) \
            / 1e6 * rate


def _multipart_file(content_type: str, data: bytes) -> bytes:
    boundary = content_type.split("boundary=", 1)[1].strip('"').encode()
    for part in data.split(b"--" + boundary):
        head, _, body = part.partition(b"\r\n\r\n")
        if b'name="file"' in head:
            return body.removesuffix(b"\r\n")
    raise ValueError("no file part")


@contextmanager
def batch_server(fake: FakeBatches) -> Iterator[str]:
    """Serve `fake` on the loopback; yields its API root (`http://127.0.0.1:PORT/v1`)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            fake.calls[f"GET {'/'.join(parts[:2])}"] += 1
            if parts == ["v1", "models"]:
                return self._json(200, {"object": "list", "data": [{"id": fake.model, "owned_by": "openai"}]})
            if parts[:2] == ["v1", "batches"] and len(parts) == 3:
                found = fake.batches.get(parts[2])
                return self._json(200, found) if found else self._json(404, {"error": {"message": "no batch"}})
            if parts[:3] == ["v1", "messages", "batches"]:
                no = anthropic.refused(fake, self.headers)
                if no:
                    return self._json(*no)
                with fake.lock:
                    fail = parts[-1] == "results" and fake.downloads_500 > 0
                    fake.downloads_500 -= fail
                    status, value = (500, {"error": {"message": "download failed"}}) if fail else \
                        anthropic.get(fake, parts, parse_qs(url.query))
                return self._bytes(value) if isinstance(value, bytes) else self._json(status, value)
            if parts == ["v1", "batches"]:
                query = parse_qs(url.query)
                limit = int(query.get("limit", ["20"])[0])
                newest = sorted((b for b in fake.batches.values() if b.get("api") != "anthropic"),
                                key=lambda b: b["id"], reverse=True)
                if "after" in query:
                    newest = [b for b in newest if b["id"] < query["after"][0]]
                page = newest[:limit]
                return self._json(200, {"object": "list", "data": page, "has_more": len(newest) > limit})
            if parts[:2] == ["v1", "files"] and len(parts) == 4 and parts[3] == "content":
                with fake.lock:
                    fail = fake.downloads_500 > 0
                    fake.downloads_500 -= fail
                if fail:
                    return self._json(500, {"error": {"message": "download failed"}})
                data = fake.files.get(parts[2])
                if data is None:
                    return self._json(404, {"error": {"message": "no file"}})
                return self._bytes(data)
            return self._json(404, {"error": {"message": f"no route {url.path}"}})

        def _bytes(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for i in range(0, len(data), CHUNK):
                self.wfile.write(data[i:i + CHUNK])
                self.wfile.flush()

        def do_POST(self) -> None:
            parts = urlsplit(self.path).path.strip("/").split("/")
            fake.calls[f"POST {'/'.join(parts[:2])}"] += 1
            data = self._body()
            if parts[:3] == ["v1", "messages", "batches"]:
                no = anthropic.refused(fake, self.headers)
                if no:
                    return self._json(*no)
                if len(parts) == 5 and parts[4] == "cancel":
                    with fake.lock:
                        return self._json(*anthropic.cancel(fake, parts[3]))
                with fake.lock:
                    if fake.creates_429 > 0:
                        fake.creates_429 -= 1
                        return self._json(429, {"type": "error", "error": {"type": "rate_limit_error"}},
                                          {"Retry-After": "0"})
                    created = anthropic.create(fake, json.loads(data))
                if fake.ends_at_create:
                    fake.run(created["id"])
                return self._json(200, created)
            if parts == ["v1", "files"]:
                content = _multipart_file(self.headers["Content-Type"], data)
                with fake.lock:
                    file_id = fake._id("file")
                    fake.files[file_id] = content
                return self._json(200, {"id": file_id, "object": "file", "purpose": "batch", "bytes": len(content)})
            if parts == ["v1", "batches"]:
                body = json.loads(data)
                with fake.lock:
                    if fake.creates_429 > 0:
                        fake.creates_429 -= 1
                        return self._json(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0"})
                    batch_id = fake._id("batch")
                    fake.batches[batch_id] = {
                        "id": batch_id, "object": "batch", "endpoint": body["endpoint"], "status": "validating",
                        "input_file_id": body["input_file_id"], "completion_window": body["completion_window"],
                        "metadata": body.get("metadata") or {}, "output_file_id": None, "error_file_id": None,
                        "request_counts": {"total": 0, "completed": 0, "failed": 0}}
                    for line in fake.requests(batch_id):
                        fake.received[line["custom_id"]] += 1
                    created = dict(fake.batches[batch_id])
                if fake.ends_at_create:  # answered as created (validating), seen ended at its first poll
                    fake.run(batch_id)
                return self._json(200, created)
            if parts[:2] == ["v1", "batches"] and len(parts) == 4 and parts[3] == "cancel":
                with fake.lock:
                    batch = fake.batches[parts[2]]
                    batch["status"] = "cancelling"
                return self._json(200, batch)
            return self._json(404, {"error": {"message": "no route"}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
