"""The provider's files and batches endpoints (OpenAI's Batch API shape), synchronous: the launcher's calls only.

Every call is retried on 408, 429, 5xx and lost connections with the OpenAI engine's backoff rule
(transforms.engines.openai.engine.retry_delay: doubling, jittered, Retry-After honoured), then fails as
BatchApiError, which the driver takes as "not now" (its work stays recorded for the next step). A download is
streamed and split into lines across reads (a results file is larger than one read), and tried again whole.
"""
from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from transforms.engines.openai.endpoint import auth_headers
from transforms.engines.openai.engine import retry_after_seconds, retry_delay
from transforms.engines.openai_batch.settings import OpenAIBatchSettings
from transforms.text_safety import redact_url

log = logging.getLogger(__name__)
CHUNK = 64 * 1024  # one read of a download
RUN_KEY, REQUEST_FILE = "pagemill_run", "pagemill_request_file"  # the metadata an OpenAI batch carries
ERROR_TEXT = 300  # an error answer is quoted this far


class BatchApiError(Exception):
    """An API call failed for good (after the retries): `status` None when the server could not be reached."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


def split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Whole lines from chunks of any size (a line may span reads); the last line needs no newline. Pure."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *lines, rest = rest.split(b"\n")
        yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest


class BatchClient:
    """OpenAI's Batch API, and the provider interface the driver calls (anthropic.py has the other one):
    submit, get, results, cancel, find. A batch is described to the driver in OpenAI's terms (its statuses)."""

    def __init__(self, s: OpenAIBatchSettings, sleep: Callable[[float], None] = time.sleep) -> None:
        import httpx

        self.s, self.sleep = s, sleep
        self.http = httpx.Client(base_url=s.base_url, headers=self.headers(),
                                 timeout=httpx.Timeout(s.request_timeout_s, connect=min(10.0, s.request_timeout_s)))

    def headers(self) -> dict[str, str]:
        return auth_headers(self.s.api_key_env)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        """One API call's JSON answer, tried again on 408/429/5xx/lost connections."""
        return self._retried(f"{method} {path}", lambda: self._once(method, path, **kw))

    def _once(self, method: str, path: str, **kw: Any) -> tuple[int | None, Any, str | None]:
        import httpx

        try:
            response = self.http.request(method, path, **kw)
        except httpx.TransportError as err:
            return None, f"{type(err).__name__}: {err}", None
        if response.status_code != 200:
            return response.status_code, response.text[:ERROR_TEXT], response.headers.get("retry-after")
        return 200, response.json(), None

    def _retried(self, what: str, once: Callable[[], tuple[int | None, Any, str | None]]) -> Any:
        tries = 0
        while True:
            tries += 1
            status, value, retry_after = once()
            if status == 200:
                return value
            wait = retry_delay(status, retry_after_seconds(retry_after, time.time()), tries, self.s,  # type: ignore[arg-type]
                               random.random())
            if wait is None:
                raise BatchApiError(status, f"{what} at {redact_url(self.s.base_url)}: "
                                            f"{'HTTP ' + str(status) if status else 'unreachable'} after {tries} "
                                            f"tries: {str(value)[:ERROR_TEXT]}")
            log.info("%s: HTTP %s, try %d again in %.1f s", what, status, tries, wait)
            self.sleep(wait)

    def upload(self, name: str, data: bytes) -> str:
        """A batch input file; its id."""
        answer = self._call("POST", "/files", data={"purpose": "batch"},
                            files={"file": (name, data, "application/jsonl")})
        return str(answer["id"])

    def create(self, file_id: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        return dict(self._call("POST", "/batches", json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": self.s.completion_window, "metadata": dict(metadata)}))

    def get(self, batch_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/batches/{batch_id}"))

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/batches/{batch_id}/cancel"))

    def batches(self) -> Iterator[dict[str, Any]]:
        """Every batch the key can see, newest first (paged with `after`)."""
        after: str | None = None
        while True:
            params = {"limit": 100, **({"after": after} if after else {})}
            page = self._call("GET", "/batches", params=params)
            data = page.get("data") or []
            yield from data
            if not page.get("has_more") or not data:
                return
            after = data[-1]["id"]

    def lines(self, file_id: str) -> list[dict[str, Any]]:
        """A file's JSONL content, parsed, read in chunks; the whole download is tried again on a failure."""
        return self.jsonl(f"/files/{file_id}/content")

    def jsonl(self, path: str) -> list[dict[str, Any]]:
        return self._retried(f"GET {path}", lambda: self._download(path))

    # The provider interface (see the class's text).
    def submit(self, entry: dict[str, Any], data: Callable[[], bytes], metadata: Mapping[str, str],
               save: Callable[[], None]) -> dict[str, Any]:
        """Create the entry's batch: its request file uploaded once (the file id recorded before the create)."""
        if not entry.get("file_id"):
            entry["file_id"] = self.upload(f"pagemill-{entry['fingerprint']}.jsonl", data())
            save()
        return self.create(entry["file_id"], metadata)

    def results(self, entry: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """An ended batch's output and error lines (OpenAI's line shape)."""
        for key in ("output_file_id", "error_file_id"):
            if entry.get(key):
                yield from self.lines(entry[key])

    def find(self, run_key: str, missing: Mapping[str, dict[str, Any]],
             known: set[str]) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], set[str]]:
        """The batches created for `missing` entries (by fingerprint) whose ids a killed launcher never wrote
        down: (entry, batch) pairs found by the metadata each batch carries, and the fingerprints still
        undecided (none here: the metadata is certain)."""
        left, found = dict(missing), []
        for batch in self.batches():
            meta = batch.get("metadata") or {}
            entry = left.pop(meta.get(REQUEST_FILE), None) if meta.get(RUN_KEY) == run_key else None
            if entry is not None:
                found.append((entry, batch))
            if not left:
                break
        return found, set()

    def _download(self, path: str) -> tuple[int | None, Any, str | None]:
        import httpx

        try:
            with self.http.stream("GET", path) as response:
                if response.status_code != 200:
                    response.read()
                    return response.status_code, response.text[:ERROR_TEXT], response.headers.get("retry-after")
                return 200, [json.loads(line) for line in split_lines(response.iter_raw(CHUNK))], None
        except httpx.TransportError as err:
            return None, f"{type(err).__name__}: {err}", None
