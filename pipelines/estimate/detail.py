"""Hints and detail for `pagemill estimate`, decided the way the run decides them: pages are rendered by the
page stage's own `render_document` and given to the hints stage's own `choose_hint` (text-layer coverage
measured on the rendered page, Tesseract where the run would run it), so the rules have one home.

Rendering costs time (tens of pages a second a core, more with OCR), so at most `--sample-pages` pages are
rendered: every page when the run has no more, else a seeded random sample of documents (their pages in
order, until the budget is spent). Pages not rendered get the share of low-detail pages measured in their
stratum (PDF pages with a text layer, PDF pages without one, images), and their image tokens are the expected
value between their low- and full-detail tokens, with a 95 % interval from that share's binomial error.
Pure apart from reading the objects again and rendering them.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.estimate.scan import Scanned
from schemas.records import DocumentRecord, PageImage
from transforms.hints.choose import HintSettings, choose_hint
from transforms.intake.reading import ObjectReader, ReadConfig, ReadFailed
from transforms.pages.render import RenderSettings, render_document

Z95 = 1.96


@dataclass(frozen=True)
class Decision:
    """What the hints stage chose for one rendered page."""

    hint: str
    source: str  # text_layer | ocr | none
    low: bool


@dataclass(frozen=True)
class Decisions:
    rendered: Mapping[tuple[str, int], Decision]  # (uri, page_index) -> decision
    low_share: Mapping[str, tuple[float, int]]  # stratum -> (share of low-detail pages, pages measured)
    pages_total: int
    seed: int
    method: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def stratum(fmt: str | None, text: str) -> str:
    """The group whose low-detail share stands for a page that was not rendered."""
    if fmt != "pdf":
        return "image"
    return "pdf_text_layer" if text.strip() else "pdf_no_text_layer"


def sample_documents(docs: Sequence[Scanned], budget: int, seed: int) -> list[Scanned]:
    """Documents in a seeded random order, as many as it takes to reach `budget` pages (all when the run
    has no more pages than that)."""
    order = list(docs)
    if sum(len(d.pages) for d in docs) > budget:
        random.Random(seed).shuffle(order)
    picked, pages = [], 0
    for doc in order:
        if pages >= budget:
            break
        picked.append(doc)
        pages += len(doc.pages)
    return picked


def decide(docs: Sequence[Scanned], render: RenderSettings, hints: HintSettings, read: ReadConfig, budget: int,
           seed: int) -> Decisions:
    """Render up to `budget` pages (see the module doc) and record the hints stage's choice for each. Objects
    are read again as the run reads them (`ObjectReader`: its retries, storage_error or unreadable)."""
    total = sum(len(d.pages) for d in docs)
    rendered: dict[tuple[str, int], Decision] = {}
    measured: dict[str, list[int]] = {}  # stratum -> [low pages, pages]
    texts = {(d.uri, p.page_index): p.text for d in docs for p in d.pages}
    kinds = {d.uri: d.format for d in docs}
    notes = []
    reader = ObjectReader(read)  # one reader, so one S3 client, for the whole sample
    for doc in sample_documents(docs, budget, seed):
        try:
            data = reader.read(doc.uri, render.max_bytes)
        except ReadFailed as err:  # its pages keep the extrapolated figure
            notes.append(f"{doc.uri}: not read again ({err.reason_code})")
            continue
        record = DocumentRecord(doc.uri, len(data), doc.doc_sha256 or "", doc.format or "", len(doc.pages))
        for page in render_document(record, data, render):
            if len(rendered) >= budget:
                break
            if not isinstance(page, PageImage):
                continue  # a failed page: the scan already knows (or it fails in the run too)
            choice = choose_hint(page, hints)
            low = choice.detail == "low"
            rendered[(doc.uri, page.page_index)] = Decision(choice.hint, choice.source, low)
            counts = measured.setdefault(stratum(kinds[doc.uri], texts.get((doc.uri, page.page_index), "")), [0, 0])
            counts[0] += int(low)
            counts[1] += 1
    share = {k: (low / n, n) for k, (low, n) in measured.items() if n}
    if len(rendered) >= total:
        method = (f"rendered every page ({total:,}): hints and detail chosen by the run's own functions "
                  "(transforms.pages.render.render_document, transforms.hints.choose.choose_hint)")
    else:
        method = (f"rendered a seeded random sample of {len(rendered):,} of {total:,} pages (--sample-pages {budget}, "
                  f"--sample-seed {seed}; whole documents in random order): hints and detail chosen by the run's "
                  "own functions; the other pages get their stratum's low-detail share, with a 95% interval")
    return Decisions(rendered, share, total, seed, method, tuple(notes))


def expected_tokens(low_tokens: int, high_tokens: int, share: float) -> float:
    return share * low_tokens + (1 - share) * high_tokens


def interval(unrendered: Mapping[str, list[tuple[int, int]]], shares: Mapping[str, tuple[float, int]],
             population: Mapping[str, int]) -> float:
    """Half-width (tokens) of the 95 % interval of the unrendered pages' image tokens. Per stratum of N pages
    of which n were rendered, the number of low-detail pages among the rest is estimated as N - n times the
    measured share p; its variance, sampling without replacement, is N^2 (1 - n/N) p (1 - p) / (n - 1), in
    pages, times the tokens going low saves on an average unrendered page. Pages are treated as independent
    draws, which documents are not: read it as a guide, tighter than the truth when a document's pages are
    alike."""
    var = 0.0
    for key, pages in unrendered.items():
        share, n = shares.get(key, (0.0, 0))
        saved = sum(high - low for low, high in pages)
        if n == 0:
            var += (saved / 2) ** 2  # nothing measured: anything between all low and all high
            continue
        size = max(population.get(key, n), n)
        # p (1 - p) is 0 when every measured page agreed: the rule of three (3 / n) is the floor of the share.
        p = min(max(share, 3 / n), 1 - 3 / n) if n > 6 else 0.5
        var += (saved / len(pages)) ** 2 * size ** 2 * (1 - n / size) * p * (1 - p) / max(n - 1, 1)
    return Z95 * math.sqrt(var)


def render_decisions(docs: Sequence[Scanned], s: Any, detail: str, hints: str, sample_pages: int,
                     seed: int) -> Decisions | None:
    """The hints stage's choices on rendered pages (pipelines.estimate.detail), where they matter: under
    --detail auto, or hints that OCR. None with --sample-pages 0 (nothing rendered: the text-layer guess)."""
    if sample_pages <= 0 or (detail != "auto" and hints not in ("auto", "ocr")):
        return None
    return decide(docs, s.render, s.hints, s.read, sample_pages, seed)  # `s`: the run's RunSettings


def detail_summary(to_model: Sequence[Any], decisions: Decisions | None, detail: str) -> dict[str, Any]:
    """How detail was decided, and the 95 % interval of the image tokens when some pages were extrapolated."""
    total = sum(p.image_tokens for p in to_model)
    if decisions is None:
        method = "not rendered" if detail == "auto" else f"--detail {detail}"
        return {"method": method, "rendered_pages": 0, "image_tokens_interval_95": [total, total]}
    unrendered: dict[str, list[tuple[int, int]]] = {}
    population: Counter[str] = Counter()
    for p in to_model:
        population[p.stratum] += 1
        if p.detail == "expected":
            unrendered.setdefault(p.stratum, []).append((p.low_detail_image_tokens, p.high_detail_image_tokens))
    half = round(interval(unrendered, decisions.low_share, population))
    # Never past every extrapolated page going low, or every one going high.
    extrapolated = [p for p in to_model if p.detail == "expected"]  # their image_tokens are the expected figure
    floor = total - sum(p.image_tokens - p.low_detail_image_tokens for p in extrapolated)
    ceiling = total + sum(p.high_detail_image_tokens - p.image_tokens for p in extrapolated)
    return {"method": decisions.method, "rendered_pages": sum(p.rendered for p in to_model),
            "extrapolated_pages": sum(len(v) for v in unrendered.values()),
            "low_share": {k: {"share": round(v[0], 4), "pages": v[1]} for k, v in decisions.low_share.items()},
            "seed": decisions.seed, "image_tokens_interval_95": [max(floor, total - half), min(ceiling, total + half)],
            "notes": list(decisions.notes)}
