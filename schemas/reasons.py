"""The reason codes: the one home of their strings (a name each, and what each means), and of which codes are
failures of the system and which of the input, the rule that `pagemill run`'s exit code
(pipelines/run/exit_codes.py) and the exit-code table of docs/tables.md follow.

A scheduler retries or pages someone for a system failure; it does neither for a bad file, which is
reported in the tables and is the answer for that file."""
from __future__ import annotations

from typing import Final

# One name per code: product code uses these names, never the strings (tests/test_repository_homes.py).
TOO_LARGE: Final = "too_large"
EMPTY: Final = "empty"
NOT_FOUND: Final = "not_found"
OUTSIDE_INPUT: Final = "outside_input"
UNSUPPORTED_FORMAT: Final = "unsupported_format"
UNREADABLE: Final = "unreadable"
STORAGE_ERROR: Final = "storage_error"
ENCRYPTED: Final = "encrypted"
TOO_MANY_PAGES: Final = "too_many_pages"
PAGE_TOO_LARGE: Final = "page_too_large"
DECOMPRESSION_BOMB: Final = "decompression_bomb"
RENDER_FAILED: Final = "render_failed"
CHANGED_DURING_RUN: Final = "changed_during_run"
OVER_TOKEN_BUDGET: Final = "over_token_budget"
ENGINE_ERROR: Final = "engine_error"
RATE_LIMITED: Final = "rate_limited"
SERVER_ERROR: Final = "server_error"
INVALID_RESPONSE: Final = "invalid_response"
ENGINE_TIMEOUT: Final = "engine_timeout"
INVALID_JSON: Final = "invalid_json"
SCHEMA_INVALID: Final = "schema_invalid"
TRUNCATED: Final = "truncated"
REPETITION: Final = "repetition"  # also the stop reason (STOP_REASONS) and the markdown flag (FLAGS) of a loop
FRONT_MATTER_INVALID: Final = "front_matter_invalid"
EXTRACTION_FAILED: Final = "extraction_failed"
BLOCKED_HASH: Final = "blocked_hash"
BLOCKED_NSFW: Final = "blocked_nsfw"
SAFETY_CHECK_ERROR: Final = "safety_check_error"
TIMEOUT: Final = "timeout"
WORKER_CRASHED: Final = "worker_crashed"
BATCH_PENDING: Final = "batch_pending"
BATCH_EXPIRED: Final = "batch_expired"
BATCH_FAILED: Final = "batch_failed"
BATCH_CANCELLED: Final = "batch_cancelled"

# The failure vocabulary. Stable strings: analysts filter on them in SQL; docs/tables.md documents each.
REASON_CODES: dict[str, str] = {
    TOO_LARGE: "object is larger than --max-bytes (decided from the listing, bytes never read)",
    EMPTY: "object has zero bytes",
    NOT_FOUND: "a URI given by name (or in an @FILE list) does not exist",
    OUTSIDE_INPUT: "lies outside this run's --input (a symlink in a listed folder leading out, or a URI the run's "
                   "listing names that no --input covers): not followed, never read",
    UNSUPPORTED_FORMAT: "magic bytes are not a supported PDF or image format",
    UNREADABLE: "the object could not be read, or the parser rejected it as corrupt",
    STORAGE_ERROR: "the object store kept failing (5xx, throttling, network) past --s3-max-attempts",
    ENCRYPTED: "PDF is password protected",
    TOO_MANY_PAGES: "page count is over --max-pages",
    PAGE_TOO_LARGE: "a page's declared size is absurd (over --max-page-points)",
    DECOMPRESSION_BOMB: "image declares more pixels than --max-image-pixels",
    RENDER_FAILED: "pdfium or Pillow could not render this page",
    CHANGED_DURING_RUN: "the object's bytes changed between intake and rendering",
    OVER_TOKEN_BUDGET: "prompt does not fit max_model_len even after resizing the page",
    ENGINE_ERROR: "the engine raised on this request (after retries), or the endpoint refused it (HTTP 4xx)",
    RATE_LIMITED: "the endpoint kept answering HTTP 429 after the retries (backoff, Retry-After honoured)",
    SERVER_ERROR: "the endpoint kept answering HTTP 5xx, or could not be reached, after the retries",
    INVALID_RESPONSE: "the endpoint's answer is not one to this request: over its size cap (from --max-tokens), "
                      "not a chat completion, or usage counts that are not counts (negative, absurd, non-integer)",
    ENGINE_TIMEOUT: "no answer within --answer-timeout-s (any engine) or --request-timeout-s (an endpoint)",
    INVALID_JSON: "model output is not JSON (after retries)",
    SCHEMA_INVALID: "model output is JSON but fails the schema (after retries)",
    TRUNCATED: "model output hit max_tokens before the JSON closed (after retries)",
    REPETITION: "model output kept repeating a short pattern and was stopped (the repetition guard; "
                "after the retry)",
    FRONT_MATTER_INVALID: "markdown output's front matter is missing or has a field the format does not allow "
                          "(after retries)",
    EXTRACTION_FAILED: "no page of the document was extracted",
    BLOCKED_HASH: "the document's sha256, or the page's sha256 or PDQ hash, is on a --blocklist",
    BLOCKED_NSFW: "the NSFW classifier scored the page at or over --nsfw-threshold",
    SAFETY_CHECK_ERROR: "a safety check raised on this page: quarantined, never sent (fail closed)",
    TIMEOUT: "the document (or one page) ran past --document-timeout-s (--page-timeout-s); its work was stopped",
    WORKER_CRASHED: "the intake or render process died on this document (a crash inside pdfium or Pillow)",
    BATCH_PENDING: "the page's request waits in a hosted batch (`--engine openai_batch`): a later `pagemill run` "
                   "with the same --run-id collects it (a row of an unfinished run, superseded by its answer)",
    BATCH_EXPIRED: "the hosted batch expired before this request ran, also after its resubmissions "
                   "(--batch-max-resubmits)",
    BATCH_FAILED: "the hosted batch, or this request in it, failed, also after its resubmissions",
    BATCH_CANCELLED: "the run's batches were cancelled (`pagemill cancel`) before this request ran",
}

# The engine, the run's own machinery or a time limit failed; the same input may well succeed next time.
SYSTEM_REASONS = frozenset({
    ENGINE_ERROR,          # the model raised (or could not start)
    RATE_LIMITED,          # a served endpoint: HTTP 429 after the retries
    SERVER_ERROR,          # a served endpoint: HTTP 5xx or unreachable after the retries
    INVALID_RESPONSE,      # a served endpoint: an answer over its size cap, misshapen, or with bad usage counts
    ENGINE_TIMEOUT,        # no answer within --answer-timeout-s, or a served endpoint's --request-timeout-s
    TIMEOUT,               # --document-timeout-s / --page-timeout-s stopped the work
    SAFETY_CHECK_ERROR,    # a safety check raised: the page is quarantined, fail closed
    EXTRACTION_FAILED,     # a document's pages produced no row at all (lost work)
    STORAGE_ERROR,         # the object store kept failing past the read retries (transforms/intake/reading.py)
    BATCH_PENDING,         # a hosted batch has not answered yet (a finished run holds none)
    BATCH_EXPIRED,         # a hosted batch expired, also after the resubmissions
    BATCH_FAILED,          # a hosted batch or its request failed, also after the resubmissions
    BATCH_CANCELLED,       # `pagemill cancel` stopped the run's batches
})
# The model ran but its answer failed the checks: data quality, reported per page, not a system failure.
MODEL_OUTPUT_REASONS = frozenset({INVALID_JSON, SCHEMA_INVALID, TRUNCATED, FRONT_MATTER_INVALID, REPETITION})
# Everything else (too_large, unreadable, encrypted, render_failed, worker_crashed, ...) is about the input.
INPUT_REASONS = frozenset(REASON_CODES) - SYSTEM_REASONS - MODEL_OUTPUT_REASONS
