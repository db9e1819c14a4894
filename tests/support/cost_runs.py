"""Runs shared by test_estimate, test_queries and test_report: made once per test run, whichever xdist worker
asks first (tests.conftest.made_once: the engine start and the run dominate their cost), each into its own
temp folder.

- `inputs_folder`: invoices (one copied: a duplicate document), two reports that share a terms page (a
  duplicate page), a scan, a PDF whose middle page is 20,000 pt wide (a failed page: `page_too_large`), a
  truncated PDF and a text file (rejected), and a file whose name is HTML.
- `extract_runs`: two runs with the tiny model under one output root, `t1` and then `t2` over the same inputs
  (the second finds the first's results in the result cache), with a blocklist that quarantines a page.
- `render_run`: the same inputs, `--extract false`.
"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from pipelines import cli
from schemas.records import DocumentRecord, PageImage
from tests.conftest import made_once
from tests.support import docmaker
from transforms.pages.render import RenderSettings, render_document

HTML_NAME = "<img src=x onerror=alert(1)>.pdf"
# The flags of tests/pipelines/test_run_extract.py (small pages and outputs keep the CPU engine quick), with the
# hint and detail of every page fixed: text layer, full detail (auto decides both from the rendered page).
# One worker process (--workers 1): the expected savings count in-run duplicate pages, which one process
# catches wherever the copies are, and several processes only when a copy lands in the same one.
RUN_FLAGS = ["--schema", "invoice", "--max-tokens", "384", "--kv-cache-gib", "0.25", "--max-side", "800",
             "--progress-every-s", "0", "--hints", "text_layer", "--detail", "high", "--workers", "1"]


def wide_middle_page_pdf() -> bytes:
    """Three pages, the middle one 20,000 pt wide (over --max-page-points): that page fails, the others render."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for data in (docmaker.text_pdf([["Wide document", "first page"]]),
                 docmaker.text_pdf([["A banner"]], page_size=(20000, 842)),
                 docmaker.text_pdf([["Wide document", "last page"]])):
        writer.add_page(PdfReader(io.BytesIO(data)).pages[0])
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def _write_inputs(root: Path) -> None:
    (root / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (root / "zz-invoice-copy.pdf").write_bytes(docmaker.invoice_pdf())
    (root / "report-a.pdf").write_bytes(docmaker.multipage_pdf(2, terms_page=True))
    (root / "report-b.pdf").write_bytes(docmaker.text_pdf([["Another report", "Different first page"],
                                                            docmaker.TERMS_LINES]))
    (root / "scan.png").write_bytes(docmaker.scanned_png())
    (root / "wide.pdf").write_bytes(wide_middle_page_pdf())
    (root / "corrupt.pdf").write_bytes(docmaker.truncated_pdf())
    (root / "notes.txt").write_bytes(b"not a document\n")
    (root / HTML_NAME).write_bytes(b"<html>not a pdf</html>\n")


def inputs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made_once(tmp_path_factory, "cost-inputs", _write_inputs)


def blocklist_last_wide_page(folder: Path) -> Path:
    """A blocklist holding the page hash of wide.pdf's last page as the runs render it: a quarantined page."""
    data = wide_middle_page_pdf()
    doc = DocumentRecord("wide.pdf", len(data), hashlib.sha256(data).hexdigest(), "pdf", 3)
    settings = RenderSettings(dpi=150, max_side=800, jpeg_quality=90, max_text_chars=20_000, max_page_points=14_400,
                              max_image_pixels=89_478_485, max_bytes=50 * 2**20)
    last = list(render_document(doc, data, settings))[2]
    assert isinstance(last, PageImage)
    path = folder / "blocklist.txt"
    path.write_text(f"# wide.pdf, page 3\nsha256:{last.page_hash}\n")
    return path


def extract_runs(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """Output root holding runs t1 and t2 of the tiny model over `inputs_folder` (wide.pdf's last page is on a
    blocklist: quarantined)."""
    inputs = inputs_folder(tmp_path_factory)

    def make(output: Path) -> None:
        blocklist = blocklist_last_wide_page(tmp_path_factory.mktemp("blocklist"))
        for run_id in ("t1", "t2"):
            code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", run_id,
                             "--model", str(model_dir), "--model-revision", "tiny", "--blocklist", str(blocklist),
                             *RUN_FLAGS])
            assert code == 0

    return made_once(tmp_path_factory, "cost-out", make)


def render_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inputs = inputs_folder(tmp_path_factory)

    def make(output: Path) -> None:
        code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "r1",
                         "--extract", "false", "--max-side", "800", "--progress-every-s", "0", "--workers", "1"])
        assert code == 0

    return made_once(tmp_path_factory, "render-out", make)
