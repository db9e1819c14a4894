"""The hints stage: PageImage (passed by the safety gate) -> PageImage with its hint, detail and flags, over
transforms/hints/choose.py's functions. Its own module so that a render child, which imports choose.py, never
imports Beam.
"""
from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from schemas.records import PageImage
from transforms.hints.choose import HintSettings, Ocr, apply_hint, choose_hint, ocr_for


class HintsDoFn(beam.DoFn):
    """PageImage (passed by the safety gate) -> PageImage with its hint, detail and flags."""

    def __init__(self, settings: HintSettings, ocr: Ocr | None = None) -> None:
        self.settings = settings
        self.ocr = ocr
        self.routes = {src: Metrics.counter("pagemill", f"hints_{src}") for src in ("text_layer", "ocr", "none")}
        self.ocr_ms = Metrics.distribution("pagemill", "ocr_ms")
        self.injections = Metrics.counter("pagemill", "hints_prompt_injection")

    def setup(self) -> None:
        self._ocr: Ocr = ocr_for(self.settings, self.ocr)

    def process(self, page: PageImage) -> Iterator[PageImage]:
        choice = choose_hint(page, self.settings, self._ocr)
        self.routes[choice.source].inc()
        if choice.ocr is not None:
            self.ocr_ms.update(int(choice.ocr.seconds * 1000))
        if "prompt_injection" in choice.flags:
            self.injections.inc()
        yield apply_hint(page, choice, self.settings)
