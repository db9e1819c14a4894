"""Where an OpenAI-compatible endpoint is and how it is asked (engine.py, pipelines/run/preflight.py): its API root,
its key, whether a credential would cross the network in clear, and its model list, read up to a cap like every
answer of the endpoint (answer.py)."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from transforms.engines.openai.answer import ERROR_BODY_BYTES, read_capped_sync
from transforms.text_safety import is_loopback, redact_url

MODEL_LIST_BYTES = 2**20  # GET /models: a list of model names, read no further than this


def base_url(endpoint: str) -> str:
    """The API root: `http://h:8000` and `http://h:8000/v1/` both give `http://h:8000/v1`. Pure."""
    url = endpoint.rstrip("/")
    rest = url.partition("://")[2]
    return url if "/" in rest else f"{url}/v1"


def auth_headers(api_key_env: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    key = environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def plain_http_warning(endpoint: str, api_key_env: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """One line when a credential (the key in --api-key-env, or a password in the URL) would cross the network
    in clear: plain http:// to a host other than the loopback. None otherwise. Pure."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return None
    what = [w for w, sent in (("the API key (--api-key-env)", bool(auth_headers(api_key_env, environ))),
                              ("the URL's password", parts.password is not None)) if sent]
    if not what:
        return None
    return (f"--endpoint {redact_url(endpoint)}: {' and '.join(what)} will go over plain http:// to "
            f"{parts.hostname}, readable on the network: use https://")


class EndpointRefused(Exception):
    """GET /models answered with an error status."""

    def __init__(self, status_code: int, text: str) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code, self.text = status_code, text


def model_list(base: str, api_key_env: str | None, timeout: Any,
               auth: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """`GET {base}/models`'s entries, the answer read up to MODEL_LIST_BYTES. Raises httpx's errors when
    it cannot be asked, EndpointRefused on an error status, ValueError on what is not a model list. `auth`: the
    provider's own key headers (Anthropic's), else the bearer token of `api_key_env`."""
    import httpx

    headers = {**(auth_headers(api_key_env) if auth is None else auth), "Accept-Encoding": "identity"}
    with httpx.stream("GET", base + "/models", headers=headers, timeout=timeout) as r:
        data, whole = read_capped_sync(r, MODEL_LIST_BYTES if r.status_code == 200 else ERROR_BODY_BYTES)
        if r.status_code != 200:
            raise EndpointRefused(r.status_code, data.decode("utf-8", "replace"))
    if not whole:
        raise ValueError(f"the answer is over {MODEL_LIST_BYTES // 2**20} MiB")
    try:
        entries = json.loads(data).get("data") or []
    except (AttributeError, RecursionError) as err:
        raise ValueError(type(err).__name__) from None
    if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
        raise ValueError("its data is not a list of models")
    return entries
