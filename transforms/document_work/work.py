"""One document's per-page CPU work in one callable: render, then the safety gate, then the hint.

With time limits on, this is what the render worker process runs (transforms/document_work/timed.py), so
--document-timeout-s and --page-timeout-s stop a check, a classifier or an OCR call that hangs as surely as
a slow pdfium render; without them, the same functions run as their own DoFns (transforms/safety/gate.py,
transforms/hints/choose.py). The order and the rules are theirs: a quarantined page never reaches the hint or OCR.

What needs the Beam worker's credentials stays in the Beam worker: it reads the document's bytes and loads
the blocklists (which may live on object storage), and hands the lists to the render process when it
starts. The classifier and any `--safety-check` are built in the render process, once per process, before
its first document's clock runs (a process killed at a deadline is replaced, and its successor builds
them again).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from schemas.records import DocumentRecord, PageImage, PageRow
from transforms.hints.choose import HintSettings, Ocr, apply_hint, choose_hint, ocr_for
from transforms.pages.render import RenderSettings, render_document
from transforms.safety.blocklist import Blocklists
from transforms.safety.gate import Checks, SafetyConfig, load_checks, quarantined_page, screen_page

RenderFn = Callable[[DocumentRecord, bytes, RenderSettings], Iterator[PageImage | PageRow]]
T = TypeVar("T")
RENDER_AHEAD = 2  # pages rendered ahead of the gate: enough to overlap, little memory (JPEG bytes)


@dataclass(frozen=True)
class PageStages:
    """The gate's and the hints' settings. `ocr`: None for Tesseract; tests inject a fault there."""

    safety: SafetyConfig
    hints: HintSettings
    ocr: Ocr | None = None


def gate_and_hint(page: PageImage, checks: Checks, stages: PageStages, ocr: Ocr) -> PageImage | PageRow:
    """A rendered page through the gate (a quarantined row), then the hints (the page, ready for the model)."""
    checked, verdict = screen_page(page, checks, stages.safety.low_detail_side)
    if verdict is not None:
        return quarantined_page(checked, verdict)
    return apply_hint(checked, choose_hint(checked, stages.hints, ocr), stages.hints)


class DocumentWork:
    """(doc, data, settings) -> every page rendered, gated and hinted: a PageImage for the model, or a
    final PageRow (failed, quarantined). Called like render_document, in the render worker process."""

    def __init__(self, stages: PageStages, lists: Blocklists, render: RenderFn = render_document) -> None:
        self.stages, self.lists, self.render = stages, lists, render
        self._checks: Checks | None = None
        self._ocr: Ocr | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What crosses to the process: settings and lists; the checks are built on its side."""
        return {"stages": self.stages, "lists": self.lists, "render": self.render, "_checks": None, "_ocr": None}

    def prepare(self) -> None:
        """Build the classifier and checks (and check Tesseract) once per process."""
        if self._checks is None:
            self._checks = load_checks(self.stages.safety, self.lists)
            self._ocr = ocr_for(self.stages.hints, self.stages.ocr)

    def __call__(self, doc: DocumentRecord, data: bytes, settings: RenderSettings) -> Iterator[PageImage | PageRow]:
        self.prepare()
        assert self._checks is not None and self._ocr is not None
        for page in ahead(self.render(doc, data, settings), RENDER_AHEAD):
            yield page if isinstance(page, PageRow) else gate_and_hint(page, self._checks, self.stages, self._ocr)


def ahead(items: Iterator[T], depth: int) -> Iterator[T]:
    """`items`, produced by a thread up to `depth` ahead of the consumer: the next page renders while this
    one is checked and hinted (pdfium, Pillow and numpy release the GIL), as when the two ran in separate
    processes. The consumer must read to the end (the render process always does: it is killed otherwise)."""
    slots: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)

    def produce() -> None:
        try:
            for item in items:
                slots.put((True, item))
            slots.put((False, None))
        except BaseException as err:  # noqa: BLE001 - raised again in the consumer
            slots.put((False, err))

    threading.Thread(target=produce, name="render-ahead", daemon=True).start()
    while True:
        more, item = slots.get()
        if not more:
            if item is not None:
                raise item
            return
        yield item
