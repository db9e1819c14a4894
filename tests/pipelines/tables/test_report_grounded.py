"""`pagemill report`: the share of each field's values found on their page (the `evidence` table), one run's and
one tenant's only. The root is planted with the real writer; the expected shares are counted here by hand from
the planted rows."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.tables import report
from schemas import tables
from schemas.layout import partition
from tests.support import planted
from tests.support.chromium import CHROMIUM, dump_dom
from tests.support.planted import T0, evidence
from transforms.store.write import write_rows


def plant(out: Path) -> None:
    """Run r1 of tenant `default`: three invoice pages; run r2, and tenant `acme`'s r1, with other answers."""
    docs = [{"run_id": run, "tenant": tenant, "source_uri": f"s3://bucket/doc-{n}.pdf", "doc_sha256": f"d{n}",
             "page_count": 1, "outcome": "extracted", "created_at": T0}
            for run, tenant, n in (("r1", "default", 1), ("r1", "default", 2), ("r1", "default", 3),
                                   ("r2", "default", 4), ("r1", "acme", 5))]
    for run, tenant in {(d["run_id"], d["tenant"]) for d in docs}:
        write_rows(partition(str(out), "documents", tenant, run), tables.DOCUMENTS,
                   [d for d in docs if (d["run_id"], d["tenant"]) == (run, tenant)])
    planted.write_evidence(out, [
        evidence(1, "total", True, (0.6, 0.8, 0.7, 0.82)), evidence(2, "total", True, (0.6, 0.8, 0.7, 0.82)),
        evidence(3, "total", False),  # made up
        evidence(1, "vendor_name", True, (0.1, 0.1, 0.3, 0.12)),
        evidence(1, "line_items[0].amount", True, (0.6, 0.5, 0.7, 0.52)), evidence(1, "line_items[1].amount", False),
        evidence(2, "tax", None),  # the page had no words: not checked, not counted
        evidence(4, "total", False, run_id="r2"), evidence(5, "vendor_name", False, tenant="acme")])


def test_the_report_shows_the_share_found_per_field(tmp_path: Path) -> None:
    out = tmp_path / "out"
    plant(out)
    data = report.collect(str(out), run_id="r1", tenant="default")
    shares = {f["label"]: (round(f["value"], 2), f["note"]) for f in data["grounded"]["fields"]}
    assert shares == {"total": (66.67, "2 of 3 found, mean score 1.00"),
                      "vendor_name": (100.0, "1 of 1 found, mean score 1.00"),
                      "line_items[].amount": (50.0, "1 of 2 found, mean score 1.00")}
    assert (data["grounded"]["values"], data["grounded"]["found"]) == (6, 4)
    assert ("values found on their page", "4 of 6 (66.7%)") in report.summary_rows(data)
    other = report.collect(str(out), run_id="r1", tenant="acme")["grounded"]
    assert other == {"values": 1, "found": 0, "fields": [{"label": "vendor_name", "value": 0.0,
                                                          "note": "0 of 1 found"}]}


def test_labels_name_the_schema_when_a_run_has_several() -> None:
    rows = [{"schema_id": "invoice", "field": "total", "values_checked": 4, "values_grounded": 3,
             "grounded_share": 0.75, "mean_score": 0.98},
            {"schema_id": "receipt", "field": "total", "values_checked": 2, "values_grounded": 0,
             "grounded_share": 0.0, "mean_score": None}]
    assert report.grounded_fields(rows) == {"values": 6, "found": 3, "fields": [
        {"label": "invoice: total", "value": 75.0, "note": "3 of 4 found, mean score 0.98"},
        {"label": "receipt: total", "value": 0.0, "note": "0 of 2 found"}]}
    assert report.grounded_fields([]) == {"values": 0, "found": 0, "fields": []}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_grounded_chart_draws_a_bar_per_field(tmp_path: Path) -> None:
    out = tmp_path / "out"
    plant(out)
    page = tmp_path / "r1.html"
    page.write_text(report.render_html(report.collect(str(out), run_id="r1", tenant="default")), encoding="utf-8")
    dom = dump_dom(page, tmp_path)
    assert re.search(r'data-charts="[^"]*\bgrounded\b', dom)
    bars = re.search(r'<div id="grounded"><svg[^>]*data-marks="(\d+)"', dom)
    assert bars and int(bars.group(1)) == 3
    assert '<section id="grounded-section">' in dom  # shown (hidden while there is no evidence)
