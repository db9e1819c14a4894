"""Anthropic's Message Batches (`--engine anthropic-batch`) behind the driver's provider interface (client.py's
BatchClient: submit, get, results, cancel, find), with its HTTP retries. The pipeline's side is the batch engine
as for OpenAI (engine.py): it spools OpenAI chat bodies, and this module translates at the edge, both ways:

- out: each request file line's chat body becomes a `{custom_id, params}` request of POST /v1/messages/batches
  (inline: no file upload): the system message as `system`, the page's data URL as a base64 image block, the
  prompt's text blocks, `max_tokens` and `temperature` (not `top_p` too: recent models refuse both). The JSON
  schema is not sent (Messages has no response_format): the prompt asks for the JSON, and the answer is validated
  as every engine's is.
- in: GET /v1/messages/batches/{id} (processing_status in_progress / canceling / ended, request_counts) becomes
  OpenAI's status words; each results line (`result.type` succeeded / errored / canceled / expired) becomes an
  OpenAI output or error line, a succeeded message a chat completion with usage input_tokens/output_tokens, so
  the driver's collection, the results files and the engine's answer checks are the same for both providers.

Headers: `x-api-key` from --api-key-env (never stored) and `anthropic-version`. The results are read from the
documented path, never from the answer's `results_url` (the key is not sent to a URL an answer names).

No metadata on a Message Batch: a batch created just before a kill, its id never recorded, is found again among
the listed batches created since its entry's `submitting_at` (less CLOCK_SKEW_S) with as many requests as the
entry and not recorded by any entry: one such batch is adopted; several are told apart by their results' custom_ids
once they end (until then the entry waits); none: the entry is created.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from schemas.reasons import BATCH_CANCELLED, BATCH_EXPIRED
from transforms.engines.openai_batch.client import BatchClient

VERSION = "2023-06-01"
CLOCK_SKEW_S = 600.0  # the provider's clock may run this far behind the launcher's
DATA_URL = re.compile(r"data:(?P<mime>[\w/+.-]+);base64,(?P<data>.*)", re.S)
STOPS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}  # Anthropic's -> OpenAI's words


def content_block(part: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI content part as an Anthropic content block. Pure."""
    if part.get("type") == "image_url":
        url = str((part.get("image_url") or {}).get("url") or "")
        found = DATA_URL.fullmatch(url)
        if found:
            return {"type": "image", "source": {"type": "base64", "media_type": found["mime"],
                                                "data": found["data"]}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    return {"type": "text", "text": str(part.get("text") or "")}


def message_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat body (engine.py's) as a Message's params. Pure."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if message.get("role") == "system":
            system.append(content if isinstance(content, str) else
                          "".join(str(p.get("text") or "") for p in content or []))
            continue
        blocks = [content_block(p) for p in content] if isinstance(content, list) else \
            [{"type": "text", "text": str(content or "")}]
        messages.append({"role": message.get("role") or "user", "content": blocks})
    params: dict[str, Any] = {"model": body.get("model"), "max_tokens": body.get("max_tokens"),
                              "messages": messages}
    if body.get("temperature") is not None:
        params["temperature"] = body["temperature"]
    if system:
        params["system"] = "\n\n".join(system)
    return params


def completion(message: Any) -> dict[str, Any]:
    """A succeeded Message as an OpenAI chat completion (what the engine's answer checks read). Its usage's
    counts pass through unchecked (openai/answer.py checks them); a message of another shape has no choices,
    so its page fails `invalid_response`. Pure."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return {"choices": []}
    text = "".join(b["text"] for b in message["content"]
                   if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
    cached = usage.get("cache_read_input_tokens")
    prompt = usage.get("input_tokens")
    if type(prompt) is int:  # the cache's tokens are input tokens too (0 in a batch without cache_control)
        prompt += sum(v for k in ("cache_creation_input_tokens", "cache_read_input_tokens")
                      if type(v := usage.get(k)) is int and v > 0)
    stop = message.get("stop_reason")
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": STOPS.get(stop, stop)}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": usage.get("output_tokens"),
                      **({"prompt_tokens_details": {"cached_tokens": cached}} if type(cached) is int else {})}}


def result_line(line: Any) -> dict[str, Any]:
    """One results line as an OpenAI output or error line. Pure."""
    if not isinstance(line, dict):
        return {}
    result = line.get("result") if isinstance(line.get("result"), dict) else {}
    kind, cid = result.get("type"), line.get("custom_id")
    if kind == "succeeded":
        return {"custom_id": cid, "error": None, "response": {"status_code": 200,
                                                              "body": completion(result.get("message"))}}
    if kind == "expired":
        return {"custom_id": cid, "error": {"code": BATCH_EXPIRED, "message": "the batch expired before it ran"}}
    if kind == "canceled":
        return {"custom_id": cid, "error": {"code": BATCH_CANCELLED, "message": "the batch was cancelled"}}
    error = result.get("error") if isinstance(result.get("error"), dict) else {}
    inner = error.get("error") if isinstance(error.get("error"), dict) else error
    return {"custom_id": cid, "error": {"code": str(inner.get("type") or kind),
                                        "message": str(inner.get("message") or f"result {kind}")[:300]}}


def status(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A Message Batch in the driver's (OpenAI's) words: in_progress, cancelling, or once ended cancelled (a cancel
    was asked), expired (some requests expired) or completed. An unknown status is not an ended one. Pure."""
    counts = batch.get("request_counts") if isinstance(batch.get("request_counts"), dict) else {}
    word = {"in_progress": "in_progress", "canceling": "cancelling"}.get(str(batch.get("processing_status")))
    if batch.get("processing_status") == "ended":
        word = "cancelled" if batch.get("cancel_initiated_at") else "expired" if counts.get("expired") else \
            "completed"
    return {"id": batch.get("id"), "status": word or f"unknown:{str(batch.get('processing_status'))[:40]}",
            "request_counts": counts, "created_at": batch.get("created_at")}


def when(value: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def api_headers(api_key_env: str | None) -> dict[str, str]:
    """Anthropic's key and version headers; the key read from the environment variable named, never stored."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"anthropic-version": VERSION, **({"x-api-key": key} if key else {})}


class AnthropicBatchClient(BatchClient):
    def headers(self) -> dict[str, str]:
        return api_headers(self.s.api_key_env)

    def submit(self, entry: dict[str, Any], data: Callable[[], bytes], metadata: Mapping[str, str],
               save: Callable[[], None]) -> dict[str, Any]:
        lines = (json.loads(line) for line in data().split(b"\n") if line.strip())
        requests = [{"custom_id": line["custom_id"], "params": message_params(line["body"])} for line in lines]
        return status(self._call("POST", "/messages/batches", json={"requests": requests}))

    def get(self, batch_id: str) -> dict[str, Any]:
        return status(self._call("GET", f"/messages/batches/{batch_id}"))

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return status(self._call("POST", f"/messages/batches/{batch_id}/cancel"))

    def results(self, entry: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return iter([result_line(line) for line in self.jsonl(f"/messages/batches/{entry['batch_id']}/results")])

    def batches(self) -> Iterator[dict[str, Any]]:
        """Every batch of the workspace, newest first (paged with `after_id`)."""
        after: str | None = None
        while True:
            page = self._call("GET", "/messages/batches", params={"limit": 100, **({"after_id": after} if after
                                                                                   else {})})
            data = page.get("data") or []
            yield from data
            if not page.get("has_more") or not data:
                return
            after = page.get("last_id") or data[-1]["id"]

    def find(self, run_key: str, missing: Mapping[str, dict[str, Any]],
             known: set[str]) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], set[str]]:
        """See the module's text: (entry, batch) pairs adopted, and the fingerprints that wait."""
        sent = {fp: e for fp, e in missing.items() if when(e.get("submitting_at")) is not None}
        if not sent:  # never sent: nothing to find
            return [], set()
        missing = sent
        since = {fp: (when(e["submitting_at"]) or 0.0) - CLOCK_SKEW_S for fp, e in missing.items()}
        oldest = min(since.values())
        candidates: dict[str, list[dict[str, Any]]] = {fp: [] for fp in missing}
        for batch in self.batches():
            created = when(batch.get("created_at"))
            if created is not None and created < oldest:
                break  # newest first: the rest is older than every unrecorded entry
            total = sum(v for v in (batch.get("request_counts") or {}).values() if type(v) is int)
            for fp, entry in missing.items():
                if batch.get("id") not in known and (created or 0.0) >= since[fp] \
                        and total == len(entry["custom_ids"]):
                    candidates[fp].append(batch)
        found, held, taken = [], set(), set(known)
        for fp, batches in candidates.items():
            batches = [b for b in batches if b.get("id") not in taken]
            if len(batches) > 1:  # told apart by their results once they have ended
                ended = [b for b in batches if b.get("processing_status") == "ended"]
                if len(ended) < len(batches):
                    held.add(fp)
                    continue
                ids = set(missing[fp]["custom_ids"])
                batches = [b for b in ended if {line.get("custom_id") for line in
                                                self.jsonl(f"/messages/batches/{b['id']}/results")} == ids]
            if len(batches) == 1:
                found.append((missing[fp], status(batches[0])))
                taken.add(batches[0].get("id"))
        return found, held
