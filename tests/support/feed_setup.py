"""The feed's engine settings, config, pages and tasks: ENGINE, config, tasks.
Moved from tests/transforms/extract/test_feed.py, which other test files imported."""
from __future__ import annotations

import io
import threading
from dataclasses import replace

from PIL import Image

from schemas.extraction import load_schema
from schemas.records import PageImage
from transforms.engines.simulated import SimulatedEngine
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.extract.stage import ExtractConfig, make_task
from transforms.model import budget

ENGINE = VllmLocalSettings(model="m", model_revision="r", max_model_len=8192, max_num_seqs=4,
                           gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                           kv_cache_gib=None, enforce_eager=True)


def config(**changes: object) -> ExtractConfig:
    base = ExtractConfig(schema=load_schema("page_text"), tenant="t", model="m", model_revision="r", render_key="k",
                         model_family="qwen2_vl", max_model_len=8192, max_tokens=256, max_attempts=2,
                         gpu_hourly_usd=2.5, api_price="gpt-4o", prices=budget.load_prices())
    return replace(base, **changes)


def page(i: int, width: int = 300) -> PageImage:
    buf = io.BytesIO()
    Image.new("RGB", (width, 400), (i % 255, 0, 0)).save(buf, format="JPEG")
    return PageImage(doc_sha256="d" * 64, source_uri=f"p{i}.png", page_index=0, page_hash=f"{i:064d}",
                     image=buf.getvalue(), width=width, height=400)


def tasks(n: int, cfg: ExtractConfig) -> list:
    return [make_task(page(i), cfg)[1] for i in range(n)]


class Counting(SimulatedEngine):
    """Records how many requests were submitted and not yet finished, at most."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.lock = threading.Lock()
        self.open = self.peak = 0

    def submit(self, prepared, sampling):
        with self.lock:
            self.open += 1
            self.peak = max(self.peak, self.open)
        future = super().submit(prepared, sampling)
        future.add_done_callback(lambda _: self._closed())
        return future

    def _closed(self) -> None:
        with self.lock:
            self.open -= 1
