"""OpenAIBatchEngine: the pipeline's side of a hosted batch (`--engine openai_batch`), behind the engine contract
(transforms/engines/base.py). It never waits for a provider: each attempt is answered from the run's collected
results (files.py) at once, or fails `batch_pending` at once after its request line is spooled for the launcher
(driver.py) to submit. The launcher runs the pipeline again once the batches are collected (pipelines/run/
batches.py): the same pages, prompts, validation and retry ladder as `--engine openai` (its request, body and
answer checks are reused: openai/prompt.py, openai/engine.py, openai/answer.py), so an invalid answer's next attempt
is spooled in that pass and goes into the next batch.

custom_id: the request's own content (its body, whose page image and prompt make the page's cache key, and the
attempt number), hashed. The same page and attempt make the same id in every pass and every worker, so an answer
is found again, and a request is submitted once however many workers or passes spool it (the driver drops ids it
holds). A custom_id that a recorded batch holds and that has no result yet waits (nothing spooled again).
"""
from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from schemas.reasons import BATCH_CANCELLED, BATCH_PENDING
from transforms.engines.base import Completion, PageRequest, Prepared, RequestFailed, RequestRejected, Sampling
from transforms.engines.openai.answer import completion_output
from transforms.engines.openai.engine import request_body, sampling_body
from transforms.engines.openai.prompt import build_request
from transforms.engines.openai_batch import files
from transforms.engines.openai_batch.settings import OpenAIBatchSettings

URL = "/v1/chat/completions"
SPOOL_LINES = 256  # spooled lines per spool file (and the rest at shutdown)


@dataclass
class BatchRequest:
    """A page's OpenAI request (openai/prompt.py) and how many attempts were made with it (the custom_id's)."""

    base: dict[str, Any]
    tries: int = 0


def custom_id(body: dict[str, Any], attempt: int) -> str:
    """The request's id: its body and attempt number, hashed. Pure."""
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + f"#{attempt}".encode()
    return "pm-" + hashlib.sha256(data).hexdigest()[:40]


def batch_line(cid: str, body: dict[str, Any]) -> bytes:
    """One line of a batch input file. Pure."""
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL, "body": body},
                      sort_keys=True, separators=(",", ":")).encode()


class OpenAIBatchEngine:
    def __init__(self, s: OpenAIBatchSettings) -> None:
        self.s = s
        self.starts = 0
        self._lock = threading.Lock()
        self._results: dict[str, dict[str, Any]] | None = None
        self._known: set[str] = set()
        self._cancelled = False
        self._spool: list[bytes] = []
        self._spooled: set[str] = set()

    def start(self) -> None:
        self._loaded()

    def sequences(self) -> int:
        return 64  # answers come at once: this only sizes the feed's window

    def prepare(self, request: PageRequest) -> Prepared:
        try:
            prepared = build_request(request)
        except Exception as err:  # this page's input (an undecodable image)
            raise RequestRejected(f"request could not be built: {type(err).__name__}: {err}") from err
        return Prepared(BatchRequest(prepared.request), 0, prepared.width, prepared.height)

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        results, known = self._loaded()
        req: BatchRequest = prepared.request
        body = request_body(self.s.model, req.base, sampling_body(sampling, req.base.get("schema_id", "schema")),
                            False)
        with self._lock:
            attempt, req.tries = req.tries, req.tries + 1
        cid = custom_id(body, attempt)
        future: Future[Completion] = Future()
        found = results.get(cid)
        if found is not None and "body" in found:
            try:
                output = completion_output(found["body"], int(req.base.get("image_tokens", 0)),
                                           int(body.get("max_tokens") or 0))
            except RequestFailed as err:
                future.set_exception(err)
            else:
                future.set_result(Completion(output, 0.0))
            return future
        if found is not None:
            future.set_exception(RequestFailed(str(found.get("failed")), str(found.get("message") or "")[:400]))
            return future
        if self._cancelled and cid not in known:  # `pagemill cancel`: nothing new is sent
            future.set_exception(RequestFailed(BATCH_CANCELLED, "the run's batches were cancelled"))
            return future
        if cid not in known:
            self._add(cid, batch_line(cid, body))
        future.set_exception(RequestFailed(BATCH_PENDING, f"request {cid} waits in a hosted batch (attempt "
                                                          f"{attempt + 1}): run again with the same --run-id"))
        return future

    def abort(self, future: Future[Completion]) -> None:
        """Nothing runs here: every future is settled when it is made."""

    def restart(self, seen: int | None = None) -> None:
        """Nothing to re-create."""

    def shutdown(self) -> None:
        """Write the spool's rest; the results are read again at the next use (a later pass sees new ones)."""
        with self._lock:
            lines, self._spool = self._spool, []
            self._results, self._known, self._spooled = None, set(), set()
        if lines:
            files.write_spool(self.s.folder, lines)

    def _add(self, cid: str, line: bytes) -> None:
        with self._lock:
            if cid in self._spooled:
                return
            self._spooled.add(cid)
            self._spool.append(line)
            lines = self._spool if len(self._spool) >= SPOOL_LINES else []
            if lines:
                self._spool = []
        if lines:
            files.write_spool(self.s.folder, lines)

    def _loaded(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        with self._lock:
            if self._results is None:
                state = files.load_state(self.s.folder, self.s.run_key)
                self._known = {cid for e in state["entries"] for cid in e["custom_ids"]}
                self._cancelled = bool(state["cancelled"])
                self._results = {line["custom_id"]: line for line in files.results(self.s.folder)}
                self.starts += 1
            return self._results, self._known
