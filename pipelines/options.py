"""pagemill's options: one Beam PipelineOptions subclass, and job files (jobs/*.yaml) that map onto it.

Every flag has a dashed spelling (`--max-bytes`) and Beam's underscored one (`--max_bytes`); a job
file uses the underscored names as keys. Flags on the command line override the job file.
"""
from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from apache_beam.options.pipeline_options import PipelineOptions

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
# Options that take several values; a command line that gives any replaces the job file's list.
LIST_OPTIONS = ("input", "blocklist", "safety_check")


def _flag(parser: Any, name: str, **kwargs: Any) -> None:
    parser.add_argument(f"--{name.replace('_', '-')}", f"--{name}", dest=name, **kwargs)


class PagemillOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        # What to read and where to write.
        _flag(parser, "input", action="append", default=None,
              help="folder, glob or @FILE listing one URI a line; repeatable")
        _flag(parser, "output", default=None, help="output root (folder or URI)")
        _flag(parser, "run_id", default=None, help="run id (default: UTC time + random suffix)")
        _flag(parser, "tenant", default="default", help="tenant name; tenants never share cache entries")
        _flag(parser, "force", type=_bool, default=False,
              help="recompute: ignore the result cache, and start an existing run id afresh")
        _flag(parser, "modified_since", default=None, help="only objects modified at or after (ISO time)")
        _flag(parser, "modified_until", default=None, help="only objects modified before (ISO time)")
        _flag(parser, "since_last_run", type=_bool, default=False,
              help="only objects modified since the last finished run of this --job_name (Beam's) and tenant")
        # Intake limits.
        _flag(parser, "max_bytes", type=int, default=50 * 2**20, help="reject objects larger than this")
        _flag(parser, "max_pages", type=int, default=5000, help="reject documents with more pages")
        _flag(parser, "max_image_pixels", type=int, default=89_478_485,
              help="reject images declaring more pixels (Pillow's own default limit)")
        _flag(parser, "max_page_points", type=float, default=14_400.0,
              help="reject PDF pages whose side is over this many points (200 inches: PDF's own limit)")
        # Rendering.
        _flag(parser, "dpi", type=float, default=150.0, help="PDF render resolution")
        _flag(parser, "max_side", type=int, default=1288, help="cap on a page image's longest side, px")
        _flag(parser, "jpeg_quality", type=int, default=90, help="quality of the page images in flight")
        _flag(parser, "max_text_chars", type=int, default=20_000, help="cap on a page's stored text layer")
        # Extraction.
        _flag(parser, "extract", type=_bool, default=True,
              help="false: render and account only (pages get status `rendered`, no model)")
        _flag(parser, "schema", default="invoice", help="shipped schema name or path to a JSON Schema")
        _flag(parser, "model", default=DEFAULT_MODEL, help="local model folder or hub id")
        _flag(parser, "model_revision", default=None, help="model revision (hub) or a label for local models")
        _flag(parser, "model_family", default="qwen2_vl", help="token-estimator family of --model")
        _flag(parser, "max_model_len", type=int, default=8192)
        _flag(parser, "max_tokens", type=int, default=1024, help="output token cap per page")
        _flag(parser, "max_attempts", type=int, default=2, help="attempts per page before it is failed")
        _flag(parser, "gpu_memory_utilization", type=float, default=0.90)
        _flag(parser, "tensor_parallel_size", type=int, default=1)
        _flag(parser, "max_num_seqs", type=int, default=256)
        _flag(parser, "limit_mm_per_prompt", type=int, default=1, help="images per prompt")
        _flag(parser, "max_in_flight", type=int, default=0,
              help="pages in flight per engine (0: twice the engine's max_num_seqs)")
        _flag(parser, "kv_cache_gib", type=float, default=None,
              help="KV cache size; set it on CPU engines (vLLM otherwise takes most of the RAM)")
        _flag(parser, "enforce_eager", type=_bool, default=False, help="skip CUDA graphs / torch.compile")
        _flag(parser, "engine_in_process", type=_bool, default=None,
              help="run vLLM's engine core in the worker process (default: yes on CPU, no on GPU)")
        _flag(parser, "engine_service", default="auto", choices=["auto", "process", "machine"],
              help="one engine per worker process, or one per machine fed by every worker process "
                   "(auto: machine with --direct_running_mode=multi_processing)")
        _flag(parser, "engine_service_dir", default=None,
              help="folder of the machine's engine service (default: run-scoped, under the temp dir)")
        _flag(parser, "max_hint_chars", type=int, default=4000, help="cap on the text hint in a prompt")
        # Safety gate (transforms/safety.py) and hints (transforms/hints.py).
        _flag(parser, "blocklist", action="append", default=None,
              help="file or URI of `sha256:<hex>` / `pdq:<hex>` lines (# comments); repeatable")
        _flag(parser, "pdq_threshold", type=int, default=31, help="largest PDQ Hamming distance that matches")
        _flag(parser, "nsfw_classifier", default="nudenet", help="nudenet, none, or module:factory")
        _flag(parser, "nsfw_threshold", type=float, default=0.8, help="quarantine pages scoring at or over this")
        _flag(parser, "safety_check", action="append", default=None,
              help="module:factory of an extra page check (a vendor hash service); repeatable")
        _flag(parser, "hints", default="auto", choices=("auto", "text_layer", "ocr", "none"),
              help="auto: text layer where it covers the page, else Tesseract")
        _flag(parser, "ocr_lang", default="eng", help="Tesseract languages, e.g. eng+deu")
        _flag(parser, "ocr_timeout_s", type=float, default=60.0, help="Tesseract time limit per page")
        _flag(parser, "min_text_coverage", type=float, default=0.6,
              help="share of a page's ink the text layer must explain to be the hint")
        _flag(parser, "detail", default="auto", choices=("auto", "low", "high"),
              help="auto: pages whose hint covers them are sent at --low-detail-side")
        _flag(parser, "low_detail_side", type=int, default=640, help="longest side of a low-detail page, px")
        _flag(parser, "injection_policy", default="drop", choices=("drop", "neutralise"),
              help="a hint that reads like instructions: left out of the prompt, or its matches removed")
        # Cost.
        _flag(parser, "gpu_hourly_usd", type=float, default=2.50)
        _flag(parser, "api_price", default="gpt-4o", help="hosted API whose list price the ledger compares")
        _flag(parser, "progress_every_s", type=float, default=5.0, help="seconds between progress lines")


def _bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def job_flags(job: Mapping[str, Any]) -> list[str]:
    """Turn a job file's mapping into flags; lists become repeated flags."""
    flags: list[str] = []
    for key, value in job.items():
        if key == "pipeline_args":
            flags.extend(str(v) for v in value)
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None:
                continue
            flags.append(f"--{key}={str(v).lower() if isinstance(v, bool) else v}")
    return flags


def load_job(path: str) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a job file is a mapping of option names to values")
    base = Path(path).resolve().parent
    # Relative paths in a job file are relative to the repo root (the job folder's parent), so that
    # `pagemill run --job jobs/demo.yaml` works from the checkout.
    data.setdefault("_base", str(base.parent))
    return data


def merge_flags(argv: Sequence[str], job_path: str | None) -> list[str]:
    """Job-file flags first, then the command line's, which win (argparse keeps the last value)."""
    if not job_path:
        return list(argv)
    job = load_job(job_path)
    base = Path(job.pop("_base"))
    for key in ("input", "output", "schema", "model"):
        if key in job:
            # Inputs and outputs are always paths; a schema or model may be a name or a hub id.
            job[key] = _resolve_paths(job[key], base, always=key in ("input", "output"))
    given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    for key in LIST_OPTIONS:
        if key in given:
            job.pop(key, None)
    return job_flags(job) + list(argv)


def _resolve_paths(value: Any, base: Path, always: bool) -> Any:
    if isinstance(value, list):
        return [_resolve_paths(v, base, always) for v in value]
    text = str(value)
    if "://" in text or text.startswith("/"):
        return text
    prefix = "@" if text.startswith("@") else ""
    candidate = base / text.removeprefix("@")
    return prefix + str(candidate) if (always or candidate.exists()) else text
