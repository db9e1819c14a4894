"""Option checks of `pagemill run`: what would fail late (a bad time, schema, model or endpoint) fails
before anything is written, as one line a user can act on (exit 2)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any


def epoch(text: str | None) -> float | None:
    if not text:
        return None
    value = dt.datetime.fromisoformat(text)
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()


def check_options(o: Any) -> list[str]:
    """Checks that save a user from a pipeline that would fail late: a bad schema, a bad time."""
    problems = []
    for name in ("modified_since", "modified_until"):
        try:
            epoch(getattr(o, name))
        except ValueError:
            problems.append(f"--{name.replace('_', '-')} {getattr(o, name)!r} is not an ISO time")
    if not 0 <= o.max_failed_fraction <= 1:
        problems.append(f"--max-failed-fraction {o.max_failed_fraction:g} is not between 0 and 1")
    for name in ("render_range_pages", "workers", "wave_objects"):
        if getattr(o, name) < 0:
            problems.append(f"--{name.replace('_', '-')} {getattr(o, name)} is negative")
    for name in ("document_timeout_s", "page_timeout_s"):
        if getattr(o, name) < 0:
            problems.append(f"--{name.replace('_', '-')} {getattr(o, name):g} is negative (0 turns it off)")
    from pipelines.run.settings import safety_config  # run_settings needs the checks below to pass
    from transforms.safety.gate import check_config

    problems += check_config(safety_config(o))  # a bad blocklist fails here, not on a worker
    if not o.extract:
        return problems
    looks_local = o.model.startswith(("/", "./", "../", "~")) or o.model.count("/") != 1
    if o.engine == "openai":  # --model is the name the endpoint serves it under
        problems += endpoint_option_problems(o)
    elif looks_local and not Path(o.model).expanduser().exists():
        problems.append(f"--model {o.model}: no such model folder (a hub id looks like org/name)")
    from schemas.extraction import SchemaError
    from transforms.model.markdown import load_output
    from transforms.model.token_math import rule_for

    try:
        _, markdown = load_output(o.schema)
        if o.write_markdown and markdown is None:
            problems.append(f"--write-markdown needs markdown output (--schema markdown or olmocr), not {o.schema}")
        if o.engine == "openai" and markdown is not None:
            # The served engine sends a JSON schema as response_format; markdown prompts are the local engine's.
            problems.append(f"--schema {o.schema}: markdown output needs --engine vllm "
                            "(served endpoints take JSON schemas)")
    except (SchemaError, OSError) as err:
        problems.append(f"--schema {o.schema}: {err}")
    try:
        rule_for(o.model_family, o.model)
    except (ValueError, OSError) as err:
        problems.append(f"--model-family {o.model_family}: {err}")
    return problems


def endpoint_option_problems(o: Any) -> list[str]:
    """`--engine openai`'s options, then the endpoint itself (pipelines/run/preflight.py)."""
    if not o.endpoint:
        return ["--engine openai needs --endpoint URL (an OpenAI-compatible API, e.g. http://host:8000/v1)"]
    if not o.endpoint.startswith(("http://", "https://")):
        return [f"--endpoint {o.endpoint}: not an http(s) URL"]
    if o.concurrency < 1 or o.request_timeout_s <= 0:
        return ["--concurrency must be at least 1 and --request-timeout-s over 0"]
    names = load_price_names()
    if o.endpoint_kind == "hosted" and o.api_price not in names:
        return [f"--api-price {o.api_price}: not in schemas/prices.json ({', '.join(names)})"]
    from pipelines.run.preflight import check_endpoint

    problem = check_endpoint(o.endpoint, o.model, o.api_key_env)
    return [problem] if problem else []


def load_price_names() -> list[str]:
    from transforms.model.budget import load_prices

    return list(load_prices()["providers"])
