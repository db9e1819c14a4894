"""OpenAIBatchSettings: a hosted batch API of the OpenAI shape (`--engine openai_batch`), and AnthropicBatchSettings
(`--engine anthropic_batch`: anthropic.py). Plain data: importing it loads no HTTP client."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from transforms.engines.openai.endpoint import base_url

# The provider's limits of one batch input file (OpenAI's Batch API: 50,000 requests, 200 MB).
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1000 * 1000


@dataclass(frozen=True)
class OpenAIBatchSettings:
    endpoint: str  # base URL of the API, e.g. https://api.openai.com/v1
    model: str  # the model name the provider knows
    folder: str  # the run's batch folder (schemas.layout.batch_folder): state, requests, spool, results
    run_key: str  # "<tenant>/<run_id>": every batch's metadata names it, so a resume finds its own batches
    api_key_env: str | None = None  # the environment variable holding the key; the key itself is never stored
    max_requests: int = MAX_REQUESTS  # --batch-max-requests (the provider's limit when smaller)
    max_bytes: int = MAX_BYTES
    max_resubmits: int = 1  # --batch-max-resubmits: how often an expired or failed request is sent again
    completion_window: str = "24h"
    request_timeout_s: float = 120.0
    max_retries: int = 4  # tries after the first, for 429 / 5xx / lost connections of one API call
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    kind: ClassVar[str] = "openai_batch"  # what transforms.engines.make builds

    @property
    def base_url(self) -> str:
        return base_url(self.endpoint)

    provider_max_requests: ClassVar[int] = MAX_REQUESTS

    @property
    def limit_requests(self) -> int:
        return max(1, min(self.max_requests, self.provider_max_requests))


# Anthropic's Message Batches: 100,000 requests or 256 MB a batch; the bytes are counted on the spooled OpenAI
# lines, so a margin is left for the translation to Message params (anthropic.py).
ANTHROPIC_MAX_REQUESTS = 100_000
ANTHROPIC_MAX_BYTES = 240 * 1000 * 1000


@dataclass(frozen=True)
class AnthropicBatchSettings(OpenAIBatchSettings):
    """Anthropic's Message Batches (`--engine anthropic_batch`): the same fields, the provider's limits."""

    max_requests: int = ANTHROPIC_MAX_REQUESTS
    max_bytes: int = ANTHROPIC_MAX_BYTES

    kind: ClassVar[str] = "anthropic_batch"
    provider_max_requests: ClassVar[int] = ANTHROPIC_MAX_REQUESTS
