"""OpenAISettings: an OpenAI-compatible endpoint (`--engine openai`). Plain data: importing it loads no HTTP client."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from transforms.engines.openai.endpoint import base_url


@dataclass(frozen=True)
class OpenAISettings:
    endpoint: str  # base URL of the API, e.g. http://gpu-7:8000/v1 (a URL without a path gets /v1)
    model: str  # the model name the server knows (vLLM's --served-model-name)
    api_key_env: str | None = None  # the environment variable holding the key; the key itself is never stored
    concurrency: int = 8
    request_timeout_s: float = 300.0
    max_retries: int = 4  # tries after the first, for 429 / 5xx / lost connections
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    kind: ClassVar[str] = "openai"  # what transforms.engines.make builds

    @property
    def base_url(self) -> str:
        return base_url(self.endpoint)
