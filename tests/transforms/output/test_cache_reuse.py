"""The document-level result cache re-checks reused pages against today's blocklists (issue 16, item 1), with
the live gate's own hash checks: the same renditions (the low-detail one too) and threshold (issue 22, item 3).

Pure tests of `document_from_cache`; the safety part of the cache configuration is tested with the
other settings (tests/transforms/model/test_cache_key.py); the pipeline test is
tests/pipelines/test_cache_safety.py.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

from schemas.records import DocumentRecord
from tests.support.pictures import encode, page_of, photo, write_list
from tests.support.stripes import entry_between, stripes
from transforms.output.cache import document_from_cache
from transforms.safety.blocklist import load_blocklists, pdq_hash
from transforms.safety.gate import BlocklistCheck, SafetyConfig, load_checks, screen_page

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DOC = DocumentRecord(uri="/in/a.pdf", size=10, doc_sha256="d" * 64, format="pdf", page_count=2)


def earlier_row(index: int, **over: Any) -> dict[str, Any]:
    base = {"tenant": "default", "doc_sha256": DOC.doc_sha256, "page_index": index, "page_hash": f"{index}" * 64,
            "cache_key": f"k{index}", "config_key": "c", "status": "ok", "schema_id": "invoice", "schema_hash": "h",
            "model": "m", "model_revision": None, "extraction": json.dumps({"page": index}), "validation_errors": [],
            "flags": [], "hint_source": "text_layer", "width": 10, "height": 14, "created_at": T0,
            "pdq_hash": None}
    return {**base, **over}


def lists(tmp_path: Any, text: str, threshold: int = 31) -> BlocklistCheck:
    path = tmp_path / "list.txt"
    path.write_text(text)
    return BlocklistCheck(load_blocklists([str(path)]), threshold)


def test_page_hash_on_todays_list_is_quarantined_not_cached(tmp_path: Any) -> None:
    rows = [earlier_row(0), earlier_row(1)]
    assert [r.status for r in document_from_cache(DOC, rows) or []] == ["cached", "cached"]
    out = document_from_cache(DOC, rows, lists(tmp_path, f"sha256:{'1' * 64}\n"))
    assert out is not None
    assert [(r.status, r.reason_code, r.route) for r in out] == [("cached", None, "cache"),
                                                                 ("quarantined", "blocked_hash", "quarantined")]
    blocked = out[1]
    assert blocked.extraction is None and blocked.page_hash == "1" * 64 and blocked.cost_usd == 0
    detail = json.loads(blocked.quarantine_detail or "{}")
    assert (detail["kind"], detail["line"]) == ("sha256", 1)


def test_pdq_near_todays_entry_is_quarantined(tmp_path: Any) -> None:
    stored, _ = pdq_hash(photo(3))
    near = f"{int(stored, 16) ^ 0b1011:064x}"  # three bits away
    rows = [earlier_row(0, pdq_hash=stored), earlier_row(1, pdq_hash=f"{int(stored, 16) ^ (2**200 - 1):064x}")]
    out = document_from_cache(DOC, rows, lists(tmp_path, f"pdq:{near}\n"))
    assert out is not None and [r.status for r in out] == ["quarantined", "cached"]
    assert json.loads(out[0].quarantine_detail or "{}")["distance"] == 3
    # --pdq-threshold applies to reused pages as it does at the gate.
    strict = document_from_cache(DOC, rows, lists(tmp_path, f"pdq:{near}\n", threshold=2))
    assert strict is not None and [r.status for r in strict] == ["cached", "cached"]


def test_row_without_the_hash_a_list_needs_is_rendered_again(tmp_path: Any) -> None:
    # Rows that do not carry a PDQ hash cannot be re-checked against a PDQ list: fail closed.
    rows = [earlier_row(0), earlier_row(1, pdq_hash="0" * 64)]
    assert document_from_cache(DOC, rows, lists(tmp_path, f"pdq:{'f' * 64}\n")) is None
    # A sha256-only list needs only the page hash, which every row has.
    out = document_from_cache(DOC, rows, lists(tmp_path, f"sha256:{'e' * 64}\n"))
    assert out is not None and [r.status for r in out] == ["cached", "cached"]


def test_a_row_carrying_its_pdq_is_preferred_and_copied(tmp_path: Any) -> None:
    later = T0 + dt.timedelta(days=1)
    rows = [earlier_row(0, pdq_hash="a" * 64), earlier_row(0, created_at=later), earlier_row(1, pdq_hash="b" * 64)]
    out = document_from_cache(DOC, rows, lists(tmp_path, f"pdq:{'0' * 64}\n"))
    assert out is not None and [r.status for r in out] == ["cached", "cached"]
    assert [r.pdq_hash for r in out] == ["a" * 64, "b" * 64]  # so the next run can re-check these copies


def test_reuse_checks_the_low_detail_rendition_as_the_gate_does(tmp_path: Any) -> None:
    # Fails before the fix: reuse matched the stored full-page PDQ only (32 bits away: over 31), so the page that
    # the gate stops by its low-detail rendition (28 bits) came back `cached`.
    doc = replace(DOC, page_count=1)
    page = page_of(encode(stripes(20)))
    clean, none = screen_page(page, load_checks(SafetyConfig(nsfw_classifier="none")), low_side=640)
    assert none is None and clean.pdq_hash and clean.pdq_hash_low  # the gate stores both for reuse
    entry = entry_between(clean.pdq_hash, clean.pdq_hash_low)
    cfg = SafetyConfig(blocklists=(write_list(tmp_path, f"pdq:{entry}\n"),), nsfw_classifier="none",
                       low_detail_side=640)
    checks = load_checks(cfg)
    _, fresh = screen_page(page, checks, low_side=cfg.low_detail_side)  # a fresh run: the gate stops it
    assert fresh is not None and (fresh.detail["where"], fresh.detail["distance"]) == ("page at low detail", 28)
    row = earlier_row(0, page_hash=clean.page_hash, width=clean.width, height=clean.height,
                      pdq_hash=clean.pdq_hash, pdq_hash_low=clean.pdq_hash_low)
    out = document_from_cache(doc, [row], checks.blocklist, cfg.lists_only().low_detail_side)  # the re-run
    assert out is not None and [(r.status, r.reason_code) for r in out] == [("quarantined", "blocked_hash")]
    detail = json.loads(out[0].quarantine_detail or "{}")
    assert (detail["where"], detail["distance"]) == (fresh.detail["where"], fresh.detail["distance"])
    assert out[0].pdq_hash_low == clean.pdq_hash_low
    # A row from before the low-detail hash was stored cannot be re-checked: its document is gated again.
    assert document_from_cache(doc, [{**row, "pdq_hash_low": None}], checks.blocklist, 640) is None
    # With no low-detail route (--detail high) no smaller rendition is ever sent, and none is checked.
    cached = document_from_cache(doc, [row], checks.blocklist, 0)
    assert cached is not None and [r.status for r in cached] == ["cached"]
    assert cached[0].pdq_hash_low == clean.pdq_hash_low  # copied, so that the next run can re-check it
