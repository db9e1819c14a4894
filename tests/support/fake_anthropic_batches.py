"""Anthropic's Message Batches in the fake batch server (tests/support/fake_batch_server.py): the routes under
/v1/messages/batches (create with inline `requests`, get, list paged by `after_id`, results as JSONL once ended,
cancel), each refusing a request without `anthropic-version: 2023-06-01` (400) or, when the fake has a key, without
that `x-api-key` (401). A batch moves only when the test says (FakeBatches.run / cancel), as OpenAI's do; each
answered request's usage (input_tokens, output_tokens) is derived from the request and added to what was billed."""
from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.fake_batch_server import FakeBatches

VERSION = "2023-06-01"
COUNTS = ("processing", "succeeded", "errored", "canceled", "expired")


def refused(fake: FakeBatches, headers: Any) -> tuple[int, dict[str, Any]] | None:
    if headers.get("anthropic-version") != VERSION:
        return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": "anthropic-version"}}
    if fake.key is not None and headers.get("x-api-key") != fake.key:
        return 401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
    return None


def view(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch as the API shows it (the fake's own fields left out)."""
    return {k: v for k, v in batch.items() if not k.startswith("_") and k != "api"}


def create(fake: FakeBatches, body: dict[str, Any]) -> dict[str, Any]:
    """Called under fake.lock."""
    batch_id = f"msgbatch_{next(fake._ids):05d}"
    now = dt.datetime.now(dt.UTC)
    requests = body["requests"]
    fake.batches[batch_id] = {
        "id": batch_id, "type": "message_batch", "api": "anthropic", "processing_status": "in_progress",
        "request_counts": {"processing": len(requests), **{k: 0 for k in COUNTS[1:]}}, "ended_at": None,
        "created_at": now.isoformat().replace("+00:00", "Z"), "expires_at": None, "cancel_initiated_at": None,
        "results_url": None, "_requests": requests}
    for request in requests:
        fake.received[request["custom_id"]] += 1
    return view(fake.batches[batch_id])


def run(fake: FakeBatches, batch: dict[str, Any], done: list[dict[str, Any]], rest: list[dict[str, Any]],
        status: str) -> None:
    """End a batch: `done` answered (or errored), `rest` expired or canceled. Called under fake.lock."""
    results, counts = [], dict.fromkeys(COUNTS, 0)
    for line in done:
        cid, params = line["custom_id"], line["body"]
        if cid in fake.errors_for:
            results.append({"custom_id": cid, "result": {"type": "errored", "error": {"type": "error", "error": {
                "type": "invalid_request_error", "message": "bad request"}}}})
            counts["errored"] += 1
            continue
        from tests.support.fake_batch_server import usage_of

        content = fake.answer(params)
        usage = usage_of(params, content)
        fake.billed.update({k: usage[k] for k in ("prompt_tokens", "completion_tokens")})
        results.append({"custom_id": cid, "result": {"type": "succeeded", "message": {
            "id": f"msg_{next(fake._ids):05d}", "type": "message", "role": "assistant", "model": params["model"],
            "content": [{"type": "text", "text": content}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}}}})
        counts["succeeded"] += 1
    kind = "canceled" if status == "cancelled" else "expired"
    results += [{"custom_id": line["custom_id"], "result": {"type": kind}} for line in rest]
    counts[kind] += len(rest)
    batch.update(processing_status="ended", request_counts=counts, _results=results,
                 ended_at=dt.datetime.now(dt.UTC).isoformat(),
                 results_url=f"https://results.invalid/v1/messages/batches/{batch['id']}/results")


def get(fake: FakeBatches, parts: list[str], query: dict[str, list[str]]) -> tuple[int, Any]:
    """GET under /v1/messages/batches: (status, JSON value), or (200, bytes) for results."""
    mine = {k: b for k, b in fake.batches.items() if b.get("api") == "anthropic"}
    if len(parts) == 3:
        newest = sorted(mine.values(), key=lambda b: b["id"], reverse=True)
        if "after_id" in query:
            newest = [b for b in newest if b["id"] < query["after_id"][0]]
        page = [view(b) for b in newest[:int(query.get("limit", ["20"])[0])]]
        return 200, {"data": page, "has_more": len(newest) > len(page),
                     "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None}
    batch = mine.get(parts[3])
    if batch is None:
        return 404, {"type": "error", "error": {"type": "not_found_error", "message": "no batch"}}
    if len(parts) == 4:
        return 200, view(batch)
    if parts[4] == "results" and batch["processing_status"] == "ended":
        return 200, b"".join(json.dumps(line).encode() + b"\n" for line in batch["_results"])
    return 404, {"type": "error", "error": {"type": "not_found_error", "message": "no results yet"}}


def cancel(fake: FakeBatches, batch_id: str) -> tuple[int, Any]:
    batch = fake.batches.get(batch_id)
    if batch is None or batch.get("api") != "anthropic":
        return 404, {"type": "error", "error": {"type": "not_found_error", "message": "no batch"}}
    if batch["processing_status"] == "in_progress":
        batch.update(processing_status="canceling", cancel_initiated_at=dt.datetime.now(dt.UTC).isoformat())
    return 200, view(batch)
