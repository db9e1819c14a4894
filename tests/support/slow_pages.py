"""A slow page classifier (`--nsfw-classifier tests.support.slow_pages:factory`): every page takes
SLOW_PAGE_S, so that a run's waves last long enough to be killed inside one. Scores every page 0.0."""
from __future__ import annotations

import os
import time
from typing import Any

SLOW_PAGE_S = float(os.environ.get("PAGEMILL_SLOW_PAGE_S", "0.4"))


class SlowClassifier:
    name = "slow"

    def score(self, image: Any) -> tuple[float, str]:
        time.sleep(SLOW_PAGE_S)
        return 0.0, "none"


def factory() -> SlowClassifier:
    return SlowClassifier()
