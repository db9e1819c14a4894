"""pagemill's options: one Beam PipelineOptions subclass, and job files (jobs/*.yaml) that map onto it.

Every flag has a dashed spelling (`--max-bytes`) and Beam's underscored one (`--max_bytes`); a job
file uses the underscored names as keys. Flags on the command line override the job file.
"""
from __future__ import annotations

import argparse
import datetime as dt
import difflib
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from pipelines.config.engine import ALIAS, CHOICES
from schemas.layout import check_identifier

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
# Options that take several values; a command line that gives any replaces the job file's list.
LIST_OPTIONS = ("input", "blocklist", "safety_check", "shared_filesystem", "catalog_property")


def _flag(parser: Any, name: str, **kwargs: Any) -> None:
    dashed = name.replace("_", "-")
    if kwargs.get("type") is parse_bool:
        # `--force` alone, `--force false`, `--force=true`, and `--no-force`. A bare flag matters beyond
        # typing too: Beam hands options to portable workers as `--name` for True.
        kwargs.update(nargs="?", const=True)
        parser.add_argument(f"--no-{dashed}", f"--no_{name}", dest=name, action="store_false",
                            default=kwargs.get("default"), help=argparse.SUPPRESS)  # argparse: first default wins
    parser.add_argument(f"--{dashed}", f"--{name}", dest=name, **kwargs)


class PagemillOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        # What to read and where to write.
        _flag(parser, "input", action="append", default=None,
              help="folder, glob or @FILE listing one URI a line; repeatable")
        _flag(parser, "output", default=None, help="output root (folder or URI)")
        _flag(parser, "run_id", default=None, help="run id (default: UTC time + random suffix)")
        _flag(parser, "tenant", default="default", help="tenant name; tenants never share cache entries")
        _flag(parser, "force", type=parse_bool, default=False,
              help="recompute: ignore the result cache, and start an existing run id afresh")
        _flag(parser, "modified_since", default=None, help="only objects modified at or after (ISO time)")
        _flag(parser, "modified_until", default=None, help="only objects modified before (ISO time)")
        _flag(parser, "since_last_run", type=parse_bool, default=False,
              help="only objects modified since the last finished run of this --job_name (Beam's) and tenant")
        _flag(parser, "shared_filesystem", action="append", nargs="?", const="/", default=None,
              help="a local folder that every worker sees at the same path (NFS, a mounted volume, an image "
                   "layer); repeatable; alone: every local path. Without it, a local --input, --output or model "
                   "folder is refused when the runner's workers may run elsewhere (docs/runners.md)")
        _flag(parser, "s3_max_attempts", type=int, default=5,
              help="attempts to read one s3:// input object (botocore standard retries) before `storage_error`")
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
        _flag(parser, "render_range_pages", type=int, default=50,
              help="render a PDF of at least twice this many pages as page ranges of this size on several "
                   "workers (0: one unit a document)")
        # Extraction.
        _flag(parser, "extract", type=parse_bool, default=True,
              help="false: render and account only (pages get status `rendered`, no model)")
        _flag(parser, "preset", default=None,
              help="a model preset (`pagemill presets`): its flags are defaults that explicit flags override")
        _flag(parser, "schema", default="invoice",
              help="shipped schema name or path to a JSON Schema, or a markdown format: markdown, olmocr")
        _flag(parser, "evidence_quotes", type=parse_bool, default=False,
              help="JSON output: also ask the model for the page text it read each value from; a quote found on "
                   "the page grounds its value (evidence method model_quote), and is not stored in the extraction")
        _flag(parser, "write_markdown", type=parse_bool, default=False,
              help="markdown output: also write one .md file per document under <output>/markdown/")
        _flag(parser, "model", default=DEFAULT_MODEL, help="local model folder or hub id")
        _flag(parser, "model_revision", default=None, help="model revision (hub) or a label for local models")
        _flag(parser, "model_family", default="qwen2_vl",
              help="token-estimator family of --model (a local folder's config.json names its own)")
        _flag(parser, "max_model_len", type=int, default=8192, help="engine context length, tokens")
        _flag(parser, "max_tokens", type=int, default=1024, help="output token cap per page")
        _flag(parser, "max_attempts", type=int, default=2, help="attempts per page before it is failed")
        _flag(parser, "answer_timeout_s", type=float, default=0.0,
              help="wall-clock limit of one answer on any engine (0: none); over it the request is aborted "
                   "and the page ends `engine_timeout`")
        _flag(parser, "prompt_layout", default="shared_first", choices=("shared_first", "image_first"),
              help="shared_first: system prompt and schema before the page's image and hint (prefix-cached "
                   "once a run); image_first: the image first (prompt version 3's order)")
        _flag(parser, "gpu_memory_utilization", type=float, default=0.90, help="passed to vllm.LLM")
        _flag(parser, "tensor_parallel_size", type=int, default=1, help="passed to vllm.LLM")
        _flag(parser, "devices", default="all",
              help="engines of a machine, one per device (or per --tensor-parallel-size group): all (every "
                   "visible GPU; one engine on a CPU), a count, or a list of device ids (0,1,3); each engine's "
                   "own process, pinned to its device (docs/extraction.md)")
        _flag(parser, "max_num_seqs", type=int, default=256, help="passed to vllm.LLM")
        _flag(parser, "limit_mm_per_prompt", type=int, default=1, help="images per prompt")
        _flag(parser, "max_in_flight", type=int, default=0,
              help="pages in flight per engine (0: twice the engine's max_num_seqs)")
        _flag(parser, "kv_cache_gib", type=float, default=None,
              help="KV cache size; set it on CPU engines (vLLM otherwise takes most of the RAM)")
        _flag(parser, "enforce_eager", type=parse_bool, default=False, help="skip CUDA graphs / torch.compile")
        _flag(parser, "engine_in_process", type=parse_bool, default=None,
              help="run vLLM's engine core in the worker process (default: yes on CPU, no on GPU)")
        _flag(parser, "engine_service", default="auto", choices=["auto", "process", "machine"],
              help="alias, kept for job files: with --engine vllm, machine is --engine vllm_machine and process "
                   "--engine vllm_local (auto: the --engine vllm rule)")
        _flag(parser, "engine_service_dir", default=None,
              help="folder of the machine's engine service (default: run-scoped, under the temp dir)")
        _flag(parser, "max_hint_chars", type=int, default=4000, help="cap on the text hint in a prompt")
        # The engine that answers the pages (pipelines/config/engine.py, transforms/engines/, docs/served.md).
        _flag(parser, "engine", default=ALIAS, choices=CHOICES,
              help="vllm_local: vLLM in each worker process; vllm_machine: one vLLM engine per machine, fed by "
                   "every worker process; openai: an OpenAI-compatible endpoint (--endpoint); openai_batch (or "
                   "openai-batch): its hosted Batch API at the batch rate; anthropic_batch (or anthropic-batch): "
                   "Anthropic's Message Batches at the batch rate; simulated: a "
                   "simulated engine (benchmarks); vllm (alias, the default): vllm_machine with "
                   "--engine-service machine or a multi-process DirectRunner, else vllm_local")
        _flag(parser, "endpoint", default=None, help="--engine openai: the API's base URL, e.g. http://host:8000/v1")
        _flag(parser, "api_key_env", default=None,
              help="--engine openai: the environment variable that holds the API key (never the key itself)")
        _flag(parser, "concurrency", type=int, default=8, help="--engine openai: requests in flight")
        _flag(parser, "request_timeout_s", type=float, default=300.0,
              help="--engine openai: time limit of one request; over it: `engine_timeout`")
        # Hosted batches (--engine openai_batch: transforms/engines/openai_batch/, pipelines/run/batches.py).
        _flag(parser, "batch_max_requests", type=int, default=50_000,
              help="--engine openai_batch: requests per batch at most (the provider's limit when smaller)")
        _flag(parser, "batch_max_resubmits", type=int, default=1,
              help="--engine openai_batch: how often an expired or failed request is sent again before its "
                   "page fails `batch_expired` / `batch_failed`")
        _flag(parser, "wait", type=parse_bool, default=False,
              help="--engine openai_batch: wait for the batches and collect them (else exit 75 while they work)")
        _flag(parser, "batch_poll_s", type=float, default=60.0,
              help="--engine openai_batch --wait: seconds between polls at most (doubling from 1 s)")
        _flag(parser, "endpoint_kind", default="served", choices=("served", "hosted"),
              help="--engine openai: served (self-hosted: --gpu-hourly-usd x wall time, route `served`) or "
                   "hosted (list price of --api-price, route `api:<provider>`)")
        _flag(parser, "workers", type=int, default=0,
              help="worker processes of a local (DirectRunner) run: 0 = one a core (in this process when the "
                   "listing is small: at most 32 objects, 2 MiB and 128 pages), 1 = in this process; "
                   "Beam's --direct_running_mode / --direct_num_workers, when given, win")
        # Safety gate (transforms/safety/gate.py) and hints (transforms/hints/choose.py).
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
        _flag(parser, "gpu_hourly_usd", type=float, default=2.50, help="your GPU's hourly cost, for the ledger")
        _flag(parser, "api_price", default="gpt-4o", help="hosted API whose list price the ledger compares")
        _flag(parser, "progress_every_s", type=float, default=5.0,
              help="seconds between progress lines, printed while the run works (0: none)")
        _flag(parser, "verbose", type=parse_bool, default=False,
              help="-v: also show on the screen the lines of vLLM, torch, Beam and the other libraries (always "
                   "in the run's log file, beside its manifest)")
        _flag(parser, "wave_objects", type=int, default=5000,
              help="list the inputs once under the run, then process them in waves of this many objects (the "
                   "first a tenth of it), one bounded pipeline each (0: one pipeline over the whole listing)")
        # Iceberg commits of the tables (transforms/store/iceberg.py, docs/lakehouse.md).
        _flag(parser, "catalog", default=None,
              help="also commit each wave's part files to Iceberg tables: `sqlite` (embedded, <output>/catalog.db), "
                   "a SQLAlchemy URI (postgresql+psycopg2://...) or a REST catalog's http(s):// URI")
        _flag(parser, "catalog_namespace", default="pagemill", help="--catalog: the namespace of the tables")
        _flag(parser, "catalog_property", action="append", default=None,
              help="--catalog: KEY=VALUE for the catalog (a REST catalog's token, credential, warehouse); repeatable")
        _flag(parser, "catalog_allow_http", type=parse_bool, default=False,
              help="--catalog http://: send its token or credential to a non-loopback host unencrypted (refused "
                   "without it)")
        # Writing as the run goes: what a kill can lose, per writer, against how many files a run makes.
        _flag(parser, "flush_rows", type=int, default=500, help="write a Parquet file every this many rows (0: off)")
        _flag(parser, "flush_seconds", type=float, default=10.0,
              help="write a Parquet file when its oldest buffered row is this old (0: off)")
        # Scheduling: time limits and the exit code.
        _flag(parser, "document_timeout_s", type=float, default=600.0,
              help="time limit for rendering, gating and hinting one document (0: none); over it: `timeout`")
        _flag(parser, "page_timeout_s", type=float, default=120.0,
              help="time limit for rendering, gating and hinting one page (0: none); over it: `timeout`")
        _flag(parser, "max_failed_fraction", type=float, default=0.05,
              help="exit 1 when more than this share of documents or pages failed for a system reason")


def parse_bool(text: str) -> bool:
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


class OptionError(ValueError):
    """Unknown or malformed options: a usage error (exit 2) whose lines name each one."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class _StrictParser(_BeamArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit; a caller decides
        raise OptionError([message])


# Flags that commands take beside the pipeline options (the job file and pipelines/config/storage.py's).
EXTRA_FLAGS = ("job", "s3_endpoint_url", "s3_region", "s3_profile", "s3_access_key_id", "s3_secret_access_key")


def known_parser() -> _StrictParser:
    """Every flag Beam's PipelineOptions subclasses register (pagemill's, runners', Dataflow's, ...), plus
    EXTRA_FLAGS: the same set Beam parses, so a flag any runner understands is never refused."""
    parser = _StrictParser(allow_abbrev=False, add_help=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # how Beam itself collects them
    for name in EXTRA_FLAGS:
        if f"--{name}" not in parser._option_string_actions:
            _flag(parser, name, default=None)
    return parser


def _nearest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def own_option_names() -> frozenset[str]:
    """The names (dests) of pagemill's own options, PagemillOptions."""
    parser = argparse.ArgumentParser(add_help=False)
    PagemillOptions._add_argparse_args(parser)
    return frozenset(a.dest for a in parser._actions)


def check_flags(flags: Sequence[str], where: str = "") -> list[str]:
    """Problems with command-line flags: unknown names (with the nearest known one), stray values and
    values of the wrong type. Empty when every flag is known and parses."""
    parser = known_parser()
    names = sorted(o for o in parser._option_string_actions if o.startswith("--"))
    try:
        _, unknown = parser.parse_known_args(list(flags))
    except OptionError as err:
        return [f"{where}{p}" for p in err.problems]
    problems, previous_unknown = [], False
    for arg in unknown:
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            problems.append(f"{where}unknown option {name}{_nearest(name, names)}")
            previous_unknown = "=" not in arg
        elif not previous_unknown:  # a value after an unknown flag is part of it
            problems.append(f"{where}unexpected argument {arg!r}")
        else:
            previous_unknown = False
    return problems


def check_job_keys(job: Mapping[str, Any], path: str) -> list[str]:
    """Job-file keys are option names with underscores (plus `pipeline_args`)."""
    parser = known_parser()
    dests = sorted({a.dest for a in parser._actions if a.dest != "help"} | {"pipeline_args"})
    problems = [f"{path}: unknown key {key!r}{_nearest(str(key), dests)}" for key in job if key not in dests]
    args = job.get("pipeline_args") or []
    if not isinstance(args, list):
        problems.append(f"{path}: pipeline_args is a list of flags")
    else:
        problems += check_flags([str(a) for a in args], f"{path}: pipeline_args: ")
    return problems


def merge_flags(argv: Sequence[str], job_path: str | None) -> list[str]:
    """Job-file flags first, then the command line's, which win (argparse keeps the last value).
    Raises OptionError naming every unknown flag or job key (a typo must not be dropped silently)."""
    problems = check_flags(argv)
    if not job_path:
        if problems:
            raise OptionError(problems)
        return list(argv)
    job = load_job(job_path)
    problems = check_job_keys({k: v for k, v in job.items() if k != "_base"}, job_path) + problems
    if problems:
        raise OptionError(problems)
    base = Path(job.pop("_base"))
    for key in ("input", "output", "schema", "model"):
        if key in job:
            # Inputs and outputs are always paths; a schema or model may be a name or a hub id.
            job[key] = _resolve_paths(job[key], base, always=key in ("input", "output"))
    given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    for key in LIST_OPTIONS:
        if key in given:
            job.pop(key, None)
    flags = job_flags(job)
    problems = check_flags(flags, f"{job_path}: ")  # values of the wrong type (`max_pages: many`)
    if problems:
        raise OptionError(problems)
    return flags + list(argv)


def _resolve_paths(value: Any, base: Path, always: bool) -> Any:
    if isinstance(value, list):
        return [_resolve_paths(v, base, always) for v in value]
    text = str(value)
    if "://" in text or text.startswith("/"):
        return text
    prefix = "@" if text.startswith("@") else ""
    candidate = base / text.removeprefix("@")
    return prefix + str(candidate) if (always or candidate.exists()) else text


# Identifiers (run ids, tenants, job names) are checked by schemas/layout.py's rule, which commands that do
# not load Beam (pagemill sql) share.


def check_identifiers(o: Any, job_name: str | None = None) -> list[str]:
    """Run id, tenant and job name of a run, checked before anything is written."""
    found = (check_identifier("--run-id", o.run_id), check_identifier("--tenant", o.tenant),
             check_identifier("--job-name", job_name))
    return [p for p in found if p]
