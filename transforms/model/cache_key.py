"""The cache configuration key, derived from the settings objects themselves. Pure: no Beam, no options.

Every field of a keyed settings dataclass is part of the key unless EXCLUDE names it, with the reason it
cannot change a page's answer. So a new setting joins the key by default (re-extracting once, never
reusing a stale answer); leaving one out is a decision written down here. Nested dataclasses (the OCR
settings inside the hint settings, the schema, the markdown format, the model's image-token rule) are
keyed the same way. tests/transforms/model/test_cache_key.py checks that every field is either keyed (changing
it changes the key) or excluded.

The serialisation is canonical JSON: each dataclass as {"ClassName": {field: value}} with sorted keys,
tuples as lists, floats as JSON numbers; a class is named by its `key_name` when it has one (EXCLUDE too). A
settings class may define `key_form()`, a copy of itself in the
form that is keyed (SafetyConfig: its checks as a set); its fields are still enumerated here, so a new one
cannot be lost on the way.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Fields that do not change a page's extraction, by class name, each with why. Everything else is keyed.
EXCLUDE: Mapping[str, Mapping[str, str]] = {
    "RenderSettings": {
        "max_page_points": "a limit: a page over it fails with a reason code, never a reusable row",
        "max_image_pixels": "a limit: an image over it is rejected, never a reusable row",
        "max_bytes": "a limit: an object over it is rejected before it is read",
    },
    "SafetyConfig": {
        # Reused rows are re-checked against today's lists by their stored hashes (transforms/output/cache.py).
        "blocklists": "re-checked at reuse by the stored page hash and PDQ hash, never keyed",
        "pdq_threshold": "re-checked at reuse with today's threshold, never keyed",
    },
    "OcrSettings": {
        "timeout_s": "a time limit, not a setting of the answer (like every timeout)",
    },
    "ExtractConfig": {
        # render_key is keyed: it is the key of the render, gate, hints and engine settings.
        "max_attempts": "how often a failed attempt is retried; a reusable row is an answer that succeeded",
        "gpu_hourly_usd": "prices the page, does not change its answer",
        "api_price": "prices the page, does not change its answer",
        "prices": "prices the page, does not change its answer",
        "max_in_flight": "how many pages are queued at the engine: throughput, not the answer",
        "route": "how the ledger counts the cost (model, served, api:...); the model is keyed by name",
        "answer_timeout_s": "a time limit, not a setting of the answer (like every timeout)",
    },
    "EngineSettings": {  # VllmLocalSettings, keyed under its former name (its key_name) for every engine kind
        # model, model_revision and max_model_len are keyed (ExtractConfig keys them too: harmless).
        "max_num_seqs": "how many sequences the engine batches at once: throughput, not the answer",
        "gpu_memory_utilization": "how much GPU memory the engine takes: capacity, not the answer",
        "tensor_parallel_size": "how many GPUs one engine spans: how it runs, not the model",
        "limit_mm_per_prompt": "a capacity limit on images per prompt; a page sends one image",
        "kv_cache_gib": "the KV cache's size: capacity, not the answer",
        "enforce_eager": "eager mode or CUDA graphs: how the same model runs",
        "in_process": "where the engine runs (this process or vLLM's engine process)",
        "devices": "how many engines of the same model answer: throughput, not the answer",
        "run_key": "names the run's engine service folder, not the answer",
    },
    "ExtractionSchema": {
        "schema": "schema_hash stands for it (sha256 of its canonical JSON)",
        "source": "where the schema was read from; schema_hash stands for its content",
    },
    "ImageTokenRule": {
        "source": "where the rule's parameters were read from; the parameters themselves are keyed",
    },
}


# Opt-in settings added after keys were first written, by class name, each with why: keyed only when set away
# from their default, so turning the feature on re-extracts while every key written before it stays valid.
KEYED_WHEN_SET: Mapping[str, Mapping[str, str]] = {
    "ExtractConfig": {
        "evidence_quotes": "--evidence-quotes changes the prompt and the answer; off, the answer is as before",
    },
}


def _keyed(value: Any, name: str, field: dataclasses.Field) -> bool:
    if field.name in EXCLUDE.get(name, {}):
        return False
    return field.name not in KEYED_WHEN_SET.get(name, {}) or getattr(value, field.name) != field.default


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        keyed = value.key_form() if hasattr(value, "key_form") else value
        # A class renamed since keys were written names itself as before (`key_name`): earlier rows still match.
        name = getattr(type(value), "key_name", type(value).__name__)
        return {name: {f.name: _canonical(getattr(keyed, f.name))
                       for f in dataclasses.fields(value) if _keyed(value, name, f)}}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    # A new setting of a type with no canonical form must be given one (or excluded), not keyed by repr.
    raise TypeError(f"no canonical form for a setting of type {type(value).__name__}")


def canonical(*settings: Any) -> str:
    """The canonical JSON of the keyed fields of `settings`, in the order given."""
    return json.dumps([_canonical(s) for s in settings], sort_keys=True, separators=(",", ":"), allow_nan=False)


def settings_key(*settings: Any) -> str:
    """sha256 of the canonical form of `settings` (dataclasses, or plain values such as a template hash)."""
    return hashlib.sha256(canonical(*settings).encode()).hexdigest()
