"""Evidence matching cost: ms a page to look every value of a page's answer up in its words (transforms/model/
evidence.py `with_evidence`: decode the words, index them, match, union boxes), beside what the CPU stages already
spend on the same page in the same run: the post-filter's flags on the answer (transforms/model/postfilter.py
`output_flags`) and the page stage's text-layer read and render (for the text layer's words, transforms/pages/
words.py, whose own cost is printed too).

    python benchmarks/bench_evidence.py [--pages 40] [--repeat 20] [--json]

Pages: born-digital invoices (pdfium's words) and scanned receipts (Tesseract's words, read once; Tesseract's own
time is the hints stage's and not counted here), each with its true values as the answer, and a made-up total on
every fifth page; and the worst case, every value made up. The budget is 5 ms a receipt-sized page. It prints
figures; it asserts nothing about time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pypdfium2  # noqa: E402

from schemas.extraction import load_schema  # noqa: E402
from schemas.records import DocumentRecord, PageImage, PageRow  # noqa: E402
from tests.support import grounded_docs  # noqa: E402
from transforms.hints.choose import HintSettings, apply_hint, choose_hint  # noqa: E402
from transforms.model.evidence import with_evidence  # noqa: E402
from transforms.model.postfilter import output_flags  # noqa: E402
from transforms.model.prompt import SYSTEM_PROMPT  # noqa: E402
from transforms.pages.render import RenderSettings, render_document  # noqa: E402
from transforms.pages.textlayer import gray_array  # noqa: E402
from transforms.pages.words import pdf_words  # noqa: E402

SETTINGS = RenderSettings(dpi=150, max_side=1288, jpeg_quality=90, max_text_chars=20000, max_page_points=14400,
                          max_image_pixels=89_478_485, max_bytes=50 * 2**20)


def page_of(doc: grounded_docs.MadeDoc) -> PageImage:
    fmt = "pdf" if doc.name.endswith(".pdf") else "png"
    record = DocumentRecord(uri=doc.name, size=len(doc.data), doc_sha256=hashlib.sha256(doc.data).hexdigest(),
                            format=fmt, page_count=1)
    (page,) = list(render_document(record, doc.data, SETTINGS))
    if fmt == "png":
        hints = HintSettings(mode="ocr")
        page = apply_hint(page, choose_hint(page, hints), hints)
    return page


def made_up(value: object) -> object:
    """Every value changed into one the page does not print."""
    if isinstance(value, dict):
        return {k: made_up(v) for k, v in value.items()}
    if isinstance(value, list):
        return [made_up(v) for v in value]
    if isinstance(value, str):
        return "Zq" + value[::-1]
    return value + 1234.56 if isinstance(value, (int, float)) else value


def per_page_ms(work, items: list, repeat: int) -> float:
    """The median over `repeat` passes of one pass's ms a page."""
    passes = []
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            work(item)
        passes.append((time.perf_counter() - start) * 1000 / len(items))
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    docs = [grounded_docs.invoice(i, made_up_total=i % 5 == 4) if i % 2 == 0 else grounded_docs.receipt(i)
            for i in range(args.pages)]
    pages = [page_of(d) for d in docs]
    schemas = {"pdf": load_schema("invoice").schema, "png": load_schema("receipt").schema}
    rows = [(PageRow.of_page(p, "ok", extraction=json.dumps(d.answer)), p, schemas[d.name[-3:]])
            for d, p in zip(docs, pages, strict=True)]
    figures: dict[str, object] = {"pages": len(rows), "values_a_page": round(statistics.mean(
        len(with_evidence(r, p.words).evidence) for r, p, _ in rows), 1)}
    for kind in ("pdf", "png"):
        mine = [(r, p, s) for (r, p, s), d in zip(rows, docs, strict=True) if d.name.endswith(kind)]
        figures[f"evidence_ms_a_page_{kind}"] = round(per_page_ms(lambda x: with_evidence(x[0], x[1].words), mine,
                                                                  args.repeat), 3)
        figures[f"postfilter_ms_a_page_{kind}"] = round(per_page_ms(
            lambda x: output_flags(x[0].extraction, x[2], SYSTEM_PROMPT), mine, args.repeat), 3)
        # The worst case: no value is on the page (a model that makes everything up), so each text value is
        # near-matched against the whole page.
        invented = [(replace(r, extraction=json.dumps(made_up(json.loads(r.extraction)))), p, sc) for r, p, sc in mine]
        figures[f"evidence_ms_a_page_{kind}_all_made_up"] = round(per_page_ms(
            lambda x: with_evidence(x[0], x[1].words), invented, args.repeat), 3)
    pdfs = [d for d in docs if d.name.endswith(".pdf")]

    def words_of(doc: grounded_docs.MadeDoc) -> None:
        pdf = pypdfium2.PdfDocument(doc.data)
        page = pdf[0]
        textpage = page.get_textpage()
        bitmap = page.render(scale=150 / 72, rev_byteorder=True)
        image = bitmap.to_pil()
        textpage.get_text_bounded()  # as the page stage has read it before (pdfium builds the text page's index once)
        gray = gray_array(image)  # the page stage's, shared with the text-layer check
        start = time.perf_counter()
        pdf_words(page, textpage, image, gray)
        words_ms.append((time.perf_counter() - start) * 1000)
        textpage.close()
        page.close()
        pdf.close()

    words_ms: list[float] = []
    for doc in pdfs * max(1, args.repeat // 4):
        words_of(doc)
    figures["text_layer_words_ms_a_page"] = round(statistics.median(words_ms), 3)
    figures["render_ms_a_page"] = round(per_page_ms(
        lambda d: list(render_document(replace(DocumentRecord(d.name, len(d.data), hashlib.sha256(d.data).hexdigest(),
                                                              "pdf", 1)), d.data, SETTINGS)),
        pdfs, max(1, args.repeat // 4)), 3)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for name, value in figures.items():
        print(f"{name:36} {value}")


if __name__ == "__main__":
    main()
