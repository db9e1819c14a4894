"""A PDF page of many invisible text runs: hidden_runs_pdf.
Moved from tests/transforms/pages/test_textlayer.py, which other test files imported."""
from __future__ import annotations

from tests.support import docmaker


def hidden_runs_pdf(n: int) -> bytes:
    """One page: `n` separate runs of microscopic (0.5 pt, invisible when rendered) text on a grid, and one
    visible line. Each run is its own text box, so an unbounded check reads the page's text `n` times."""
    ops = [docmaker.text_op(56, 30, "Total due: 120.00 GBP"), b"BT /F1 0.5 Tf\n"]
    for i in range(n):
        ops.append(b"1 0 0 1 %g %g Tm (ab) Tj\n" % (20 + (i % 100) * 5.5, 820 - (i // 100) * 9))
    ops.append(b"ET\n")
    return docmaker.build_pdf([b"".join(ops)])
