"""Which reason codes are failures of the system, and which of the input: the one home of the rule that
`pagemill run`'s exit code (pipelines/run/exit_codes.py) and the exit-code table of docs/tables.md follow.

A scheduler retries or pages someone for a system failure; it does neither for a bad file, which is
reported in the tables and is the answer for that file."""
from __future__ import annotations

from schemas.records import REASON_CODES

# The engine, the run's own machinery or a time limit failed; the same input may well succeed next time.
SYSTEM_REASONS = frozenset({
    "engine_error",        # the model raised (or could not start)
    "rate_limited",        # a served endpoint: HTTP 429 after the retries
    "server_error",        # a served endpoint: HTTP 5xx or unreachable after the retries
    "invalid_response",    # a served endpoint: an answer over its size cap, misshapen, or with bad usage counts
    "engine_timeout",      # no answer within --answer-timeout-s, or a served endpoint's --request-timeout-s
    "timeout",             # --document-timeout-s / --page-timeout-s stopped the work
    "safety_check_error",  # a safety check raised: the page is quarantined, fail closed
    "extraction_failed",   # a document's pages produced no row at all (lost work)
    "storage_error",       # the object store kept failing past the read retries (transforms/intake/reading.py)
})
# The model ran but its answer failed the checks: data quality, reported per page, not a system failure.
MODEL_OUTPUT_REASONS = frozenset({"invalid_json", "schema_invalid", "truncated", "front_matter_invalid", "repetition"})
# Everything else (too_large, unreadable, encrypted, render_failed, worker_crashed, ...) is about the input.
INPUT_REASONS = frozenset(REASON_CODES) - SYSTEM_REASONS - MODEL_OUTPUT_REASONS
