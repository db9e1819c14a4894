"""Feeding a list of pages through the real feed (transforms/extract/feed.py) to an engine, for tests and
benchmarks; the pipeline feeds pages through the stage's DoFn instead."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from schemas.records import ExtractionResult, PageTask
from transforms.engines.base import PageEngine, Prepared
from transforms.extract.config import ExtractConfig
from transforms.extract.feed import PageFeed


def extract_all(engine: PageEngine, tasks: list[PageTask], cfg: ExtractConfig,
                max_in_flight: int = 8) -> list[ExtractionResult]:
    """Every task's final result, in order."""
    feed = PageFeed(engine, cfg, max_in_flight)
    futures: list[Future[ExtractionResult]] = []
    for task in tasks:
        feed.slots.acquire()
        futures.append(Future())
        feed.start(task, futures[-1])
    return [f.result() for f in futures]


def vllm_request(prompt: str, image: Any) -> Prepared:
    """A Prepared of a vLLM engine's form, for a prompt text and a PIL image (the size it is sent at)."""
    return Prepared({"prompt": prompt, "multi_modal_data": {"image": image}}, 0, image.width, image.height)
