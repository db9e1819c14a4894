"""The run manifest's evidence totals: the run's `evidence` rows, those found on their page and those not found,
read from the raw rows of that run and tenant only. Rows planted with the real writer; counts by hand."""
from __future__ import annotations

from pathlib import Path

from pipelines.tables.manifest import run_counts
from tests.support import planted
from tests.support.planted import evidence


def test_totals_count_the_runs_evidence(tmp_path: Path) -> None:
    out = tmp_path / "out"
    planted.write_evidence(out, [
        evidence(1, "total", True, (0.6, 0.8, 0.7, 0.82)), evidence(1, "vendor_name", True, (0.1, 0.1, 0.3, 0.12)),
        evidence(1, "tax", False), evidence(2, "total", None), evidence(2, "vendor_name", None),  # d2: no words
        evidence(3, "total", False, run_id="r2"), evidence(4, "total", True, (0, 0, 1, 1), tenant="acme")])
    totals = run_counts(str(out), "r1")["totals"]
    assert (totals["evidence_values"], totals["evidence_grounded"], totals["evidence_ungrounded"]) == (5, 2, 1)
    other = run_counts(str(out), "r1", tenant="acme")["totals"]
    assert (other["evidence_values"], other["evidence_grounded"], other["evidence_ungrounded"]) == (1, 1, 0)
    empty = run_counts(str(out), "r9")["totals"]  # a render-only run: no JSON answers, no evidence
    assert (empty["evidence_values"], empty["evidence_grounded"], empty["evidence_ungrounded"]) == (0, 0, 0)
