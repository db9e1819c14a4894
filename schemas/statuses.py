"""The status vocabulary: what a `pages.status` and a `documents.outcome` can be, and which statuses
count as an answer. Stable strings (analysts filter on them in SQL); docs/tables.md documents each, and
tests/test_docs.py checks that it lists exactly these."""
from __future__ import annotations

from collections.abc import Iterable

# Page statuses (the `pages.status` column).
OK = "ok"
INVALID = "invalid"
FAILED = "failed"
DUPLICATE = "duplicate"
CACHED = "cached"
QUARANTINED = "quarantined"
RENDERED = "rendered"

PAGE_STATUSES = {
    OK: "the model's answer passed validation",
    INVALID: "the model answered but the answer failed validation after every attempt",
    FAILED: "no answer: the page could not be rendered, or the model could not be used on it (reason_code says why)",
    DUPLICATE: "same cache key as a page extracted in this run: same extraction, no model call",
    CACHED: "reused from an earlier run",
    QUARANTINED: "stopped by the safety gate: never sent to a model",
    RENDERED: "a render-only run (`--extract false`): rendered, gated and hinted, no model",
}

# Statuses whose extraction is a valid answer: they make a document `extracted`, and the result cache
# reuses them (transforms/output/outcome.py, transforms/output/cache.py).
SUCCESS = frozenset({OK, CACHED, DUPLICATE})
# Statuses of pages the model answered (a cached or duplicate page never reached it).
MODEL_ANSWERED = frozenset({OK, INVALID})

# Document outcomes (the `documents.outcome` column); FAILED, DUPLICATE, CACHED, QUARANTINED and RENDERED
# are spelled as the page statuses of the same name.
EXTRACTED = "extracted"
PARTIAL = "partial"
REJECTED = "rejected"

OUTCOMES = {
    EXTRACTED: "every page ok, duplicate or cached (not all cached)",
    PARTIAL: "some pages succeeded, others did not",
    FAILED: "no page extracted",
    DUPLICATE: "byte-identical to another listed object (`duplicate_of`): its pages are not processed",
    REJECTED: "intake refused the object (reason_code says why)",
    RENDERED: "every page rendered, in a render-only run",
    CACHED: "every page reused from an earlier run",
    QUARANTINED: "the safety gate stopped the document, or every page of it",
}
# Outcomes whose message lists the page statuses that were not a success.
UNSUCCESSFUL = frozenset({PARTIAL, FAILED, QUARANTINED})


def sql_list(statuses: Iterable[str]) -> str:
    """A SQL list for `IN`, e.g. ('cached', 'duplicate', 'ok'): sorted, so the SQL text is stable."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(statuses)) + ")"
