"""The exit code of `pagemill run`, from the counts read back from the written tables (so it is decided
after every row is written, and agrees with what a query of the tables would say). Pure.

| code | when |
| 0 | the run did its job (bad inputs are reported in the tables, not in the exit code) |
| 1 | more than --max-failed-fraction of documents or pages failed for a system reason, or the tables
|     break an invariant (a key with two rows) |
| 2 | usage or pre-flight error: nothing ran (decided in pipelines/cli.py before the pipeline) |
| 3 | the model could not be used at all: every page that reached it failed with `engine_error` |
| 75 | hosted batches still working (EX_TEMPFAIL: try again later; decided in pipelines/run/batches.py) |
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.reasons import ENGINE_ERROR, SYSTEM_REASONS
from schemas.statuses import MODEL_ANSWERED

OK, FAILED, USAGE, MODEL_UNUSABLE = 0, 1, 2, 3
TRY_LATER = 75  # EX_TEMPFAIL (sysexits.h): cron wrappers and schedulers read it as "run again later"


def exit_code(counts: Mapping[str, Any], max_failed_fraction: float) -> tuple[int, str]:
    """(code, the rule that set it, in words) for one run's counts (pipelines/tables/manifest.py run_counts)."""
    page_reasons: Mapping[str, int] = counts.get("page_reasons") or {}
    statuses: Mapping[str, int] = counts.get("pages") or {}
    engine_errors = page_reasons.get(ENGINE_ERROR, 0)
    answered = sum(statuses.get(s, 0) for s in MODEL_ANSWERED)
    if engine_errors and not answered:
        return MODEL_UNUSABLE, (f"the model could not be used: all {engine_errors} pages sent to it failed "
                                "with engine_error")
    if counts.get("errors"):
        return FAILED, f"the tables break an invariant ({len(counts['errors'])} error(s))"
    pages = sum(statuses.values())
    documents = int(counts.get("documents") or 0)
    doc_reasons: Mapping[str, int] = counts.get("document_reasons") or {}
    failed_pages = sum(n for r, n in page_reasons.items() if r in SYSTEM_REASONS)
    failed_docs = sum(n for r, n in doc_reasons.items() if r in SYSTEM_REASONS)
    for what, failed, total in (("documents", failed_docs, documents), ("pages", failed_pages, pages)):
        if total and failed / total > max_failed_fraction:
            return FAILED, (f"{failed} of {total} {what} ({failed / total:.1%}) failed for system reasons, "
                            f"over --max-failed-fraction {max_failed_fraction:g}")
    worst = max(failed_docs / documents if documents else 0.0, failed_pages / pages if pages else 0.0)
    return OK, (f"system failures {worst:.1%} of documents/pages, within --max-failed-fraction "
                f"{max_failed_fraction:g}")
