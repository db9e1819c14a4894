"""The real engine, recording every request it is given: ProbeEngine.
Moved from tests/pipelines/test_safety_pipeline.py, which other test files imported."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
from PIL import Image

from transforms.engines.vllm_local.engine import VllmLocalEngine
from transforms.safety.blocklist import pdq_hash


class ProbeEngine(VllmLocalEngine):
    """The real engine, recording every request it is given (image size and PDQ, prompt text) to a file."""

    def __init__(self, settings: Any, log: str) -> None:
        self.log = log
        super().__init__(settings)

    def submit(self, prepared: Any, sampling: Any) -> Any:
        request = prepared.request
        img: Image.Image = request["multi_modal_data"]["image"]
        with open(self.log, "a") as handle:
            handle.write(json.dumps({"size": list(img.size), "pdq": pdq_hash(img)[0],
                                     "mean": float(np.asarray(img.convert("L")).mean()),
                                     "prompt": request["prompt"]}) + "\n")
        return super().submit(prepared, sampling)
