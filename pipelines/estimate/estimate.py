"""`pagemill estimate`: what a run would cost, before it runs. A dry run in plain Python (no Beam pipeline,
no model, no GPU): list the inputs, read and hash them, sniff, count pages and measure them without
rendering (`pipelines.estimate.scan`), apply dedup by sha256 and the result cache, then count tokens and
price them: self-hosted GPU time from a measured throughput, and hosted APIs at their list prices.

Every figure says where it comes from (the `assumptions` list). Image tokens for --model-family are the
page stage's exact sizes through `transforms.model.token_math`'s estimator (exact for Qwen2-VL); the prompt's text
tokens are exact when --model's tokenizer is on this machine, else characters / 4.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from pipelines.config.options import PagemillOptions
from pipelines.config.storage import StorageConfig
from pipelines.estimate.detail import Decisions, detail_summary, expected_tokens, render_decisions, stratum
from pipelines.estimate.scan import (
    CacheKeyParts,
    Scanned,
    ScanSettings,
    cached_documents,
    duplicates,
    measured_output_tokens,
    scan,
)
from pipelines.run.settings import RunSettings, run_settings
from schemas.extraction import ExtractionSchema
from schemas.reasons import OVER_TOKEN_BUDGET
from schemas.records import API_ROUTE_PREFIX
from schemas.statuses import FAILED, REJECTED
from transforms.extract.config import ExtractConfig
from transforms.hints.choose import HintSettings
from transforms.intake.listing import list_matching
from transforms.model import budget, token_math
from transforms.model.markdown import MarkdownFormat
from transforms.model.prompt import SHARED_FIRST, SYSTEM_PROMPT, chat_messages, clean_hint, control_tokens, user_text
from transforms.pages.sizes import low_detail_size


@dataclass(frozen=True)
class Throughput:
    pages_per_s: float
    source: str


def load_throughput(model: str, override: float | None) -> Throughput:
    """--pages-per-second, else the measurement in schemas/throughput.json for --model, else its default."""
    if override is not None:
        if override <= 0:
            raise ValueError("--pages-per-second must be > 0")
        return Throughput(override, "--pages-per-second")
    table = json.loads(resources.files("schemas").joinpath("throughput.json").read_text(encoding="utf-8"))
    name = os.path.basename(model.rstrip("/"))
    for m in table["measurements"].values():
        if model in m["models"] or name in m["models"]:
            return Throughput(float(m["pages_per_s"]), f"measured by {m['command']} on {m['measured_on']}: "
                                                        f"{m['description']}")
    m = table["measurements"][table["default"]]
    return Throughput(float(m["pages_per_s"]),
                      f"NOT a measurement of {model}: the default, measured by {m['command']} on {m['measured_on']} "
                      f"for {m['description']}; pass --pages-per-second with your own figure")


class PromptTokens:
    """Text tokens of one page's prompt (system message, schema, hint) as the engines' prompt counts them
    (`transforms.engines.vllm_shared.templated.Templated.prepare`): exact with --model's own tokenizer and chat
    template when they are on this machine (offline), else characters / 4 of the same text."""

    def __init__(self, model: str, revision: str | None, schema: ExtractionSchema,
                 markdown: MarkdownFormat | None = None, layout: str = SHARED_FIRST) -> None:
        self.schema = dict(schema.schema)
        self.markdown = markdown
        self.layout = layout
        self.tokenizer = _local_tokenizer(model, revision)
        self.controls = control_tokens(self.tokenizer) if self.tokenizer is not None else ()
        self.method = ("exact (the tokenizer and chat template of --model)" if self.tokenizer is not None
                       else "estimate (characters / 4; --model's tokenizer is not on this machine)")
        self._empty: int | None = None  # the prompt of a page without a hint, counted once

    def count(self, hint: str) -> int:
        return self.count_many([hint])[0]

    def count_many(self, hints: Sequence[str], chunk: int = 512) -> list[int]:
        """Counts for many hints; the tokenizer encodes them in batches (in parallel, in Rust)."""
        if self.tokenizer is None:
            if self.markdown is not None:
                return [budget.text_tokens_estimate(_text(self.markdown.messages(h))) for h in hints]
            return [budget.text_tokens_estimate(SYSTEM_PROMPT + user_text(self.schema, h)) for h in hints]
        if self._empty is None:
            self._empty = self._encode([self._prompt("")])[0]
        todo = [i for i, h in enumerate(hints) if h]
        counts = [self._empty] * len(hints)
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            for i, n in zip(part, self._encode([self._prompt(hints[i]) for i in part]), strict=True):
                counts[i] = n
        return counts

    def _prompt(self, hint: str) -> str:
        messages = self.markdown.messages(hint, self.controls, self.layout) if self.markdown is not None \
            else chat_messages(self.schema, hint, controls=self.controls, layout=self.layout)
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, texts: list[str]) -> list[int]:
        """Tokens of each prompt text, minus its one image placeholder (which becomes the image tokens)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return [len(e.ids) - 1 for e in backend.encode_batch(texts, add_special_tokens=False)]
        return [len(self.tokenizer.encode(t, add_special_tokens=False)) - 1 for t in texts]


def _text(messages: list[dict[str, Any]]) -> str:
    """The text parts of chat messages (the characters / 4 estimate counts these)."""
    parts = [m["content"] if isinstance(m["content"], str) else
             "".join(c.get("text", "") for c in m["content"]) for m in messages]
    return "\n".join(parts)


def _local_tokenizer(model: str, revision: str | None) -> Any:
    """--model's tokenizer from a local folder or the local Hugging Face cache; never downloads."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model, revision=None if os.path.isdir(model) else revision,
                                             local_files_only=True)
    except Exception:  # noqa: BLE001 - no transformers, or the model is not here: fall back to the estimate
        return None


@dataclass(frozen=True)
class PagePlan:
    """One page of a document that would reach the model stage, as the estimate sees it."""

    source_uri: str
    page_index: int
    width: int
    height: int
    sent_width: int
    sent_height: int
    image_tokens: int
    text_tokens: int
    status: str  # model | failed
    reason_code: str | None = None
    detail: str = "high"  # high | low | expected (not rendered: its stratum's low share, see estimate_detail)
    high_detail_image_tokens: int = 0
    low_detail_image_tokens: int = 0
    stratum: str = ""
    rendered: bool = False


@dataclass(frozen=True)
class HintPolicy:
    """The run's --hints / --detail choices as far as they can be known without rendering."""

    hints: str = "auto"  # auto | text_layer | ocr | none
    detail: str = "auto"  # auto | low | high
    low_detail_side: int = 640

    @classmethod
    def of(cls, s: HintSettings) -> HintPolicy:
        return cls(s.mode, s.detail, s.low_detail_side)

    def hint(self, text: str, max_chars: int) -> str:
        """The text layer is the hint under auto and text_layer (OCR text cannot be known without rendering)."""
        return clean_hint(text, max_chars) if self.hints in ("auto", "text_layer") and text.strip() else ""

    def low(self, text: str, hint: str, max_chars: int) -> bool:
        """--detail low, or auto with a text-layer hint that is not cut short: the run also requires that the
        text layer explains 90 % of the page's ink, which only rendering shows, so this assumes it does."""
        if self.detail != "auto":
            return self.detail == "low"
        return bool(hint) and len(text.strip()) <= max_chars


def plan_pages(docs: Sequence[Scanned], s: RunSettings, cfg: ExtractConfig, prompt: PromptTokens,
               policy: HintPolicy, decisions: Decisions | None = None) -> list[PagePlan]:
    """Each page's tokens: the hint and detail the hints stage chose for it when it was rendered
    (`decisions`), else those of `policy` (detail: the measured low-detail share of its stratum when
    there is one), then the engine stage's own budget rule (`budget.fit_image`: an image too large for the
    context left after the prompt and --max-tokens is shrunk to fit, or fails as over_token_budget)."""
    pages = [(d.uri, d.format, p) for d in docs for p in d.pages]
    rendered = decisions.rendered if decisions else {}
    chosen = [rendered.get((uri, p.page_index)) for uri, _, p in pages]
    max_chars = s.hints.max_hint_chars
    hints = [c.hint if c else policy.hint(p.text, max_chars) for c, (_, _, p) in zip(chosen, pages, strict=True)]
    side = policy.low_detail_side
    family = cfg.model_family  # token_math.rule_for: the model folder's processor settings when it is local
    plans = []
    for (uri, fmt, p), hint, text_tokens, choice in zip(pages, hints, prompt.count_many(hints), chosen, strict=True):
        if p.reason_code:
            plans.append(PagePlan(uri, p.page_index, 0, 0, 0, 0, 0, 0, FAILED, p.reason_code))
            continue
        group = stratum(fmt, p.text)
        share = None if choice is not None or decisions is None or policy.detail != "auto" or side <= 0 \
            else decisions.low_share.get(group, (None, 0))[0]
        low = (choice.low if choice is not None else policy.low(p.text, hint, max_chars)) and side > 0
        high = budget.fit_image(p.width, p.height, text_tokens, cfg.max_tokens, cfg.max_model_len, family)
        small = budget.fit_image(*low_detail_size(p.width, p.height, side), text_tokens, cfg.max_tokens,
                                 cfg.max_model_len, family) if side > 0 else high
        size = small if (low if share is None else share >= 0.5) else high
        if size is None:
            plans.append(PagePlan(uri, p.page_index, p.width, p.height, 0, 0, 0, 0, FAILED, OVER_TOKEN_BUDGET))
            continue
        tokens = {k: token_math.estimate_image_tokens(family, *v) if v else 0 for k, v in
                  (("low", small), ("high", high), ("sent", size))}
        full = token_math.estimate_image_tokens(family, p.width, p.height)
        if share is not None:  # not rendered: the expected tokens at its stratum's measured low share
            plans.append(PagePlan(uri, p.page_index, p.width, p.height, size[0], size[1],
                                  round(expected_tokens(tokens["low"] or tokens["high"], tokens["high"] or
                                                        tokens["low"], share)), text_tokens, "model",
                                  detail="expected", high_detail_image_tokens=full,
                                  low_detail_image_tokens=tokens["low"], stratum=group))
            continue
        plans.append(PagePlan(uri, p.page_index, p.width, p.height, size[0], size[1], tokens["sent"], text_tokens,
                              "model", detail="low" if low and size != (p.width, p.height) else "high",
                              high_detail_image_tokens=full, low_detail_image_tokens=tokens["low"],
                              stratum=group, rendered=choice is not None))
    return plans


DETAIL_NOTES = {
    "auto": "pages with a text-layer hint at --low-detail-side {side} (assuming the text layer covers the page, "
            "which the run measures on the rendered page), the others at full size",
    "low": "every page at --low-detail-side {side}",
    "high": "every page at full size",
}
NOT_COUNTED = ("not counted: identical pages inside different documents (the run extracts them once; finding them "
               "needs rendering), OCR text of pages not rendered,"
               " pages the safety gate quarantines, hints dropped as prompt injection, "
               "retries (--max-attempts), pages that fail to render")
HOSTED_NOTE = ("hosted APIs: each one's image-token formula on the page as sent, plus the same text and output tokens "
               "as the self-hosted model (as the ledger's api_equivalent_usd does)")


def output_figure(output: str | None, max_tokens: int, storage: StorageConfig, key: CacheKeyParts,
                  given: float | None) -> tuple[float, str]:
    """Output tokens a page, and where the figure comes from."""
    if given is not None:
        return given, f"--output-tokens {given:g} a page"
    measured = measured_output_tokens(output, storage, key) if output else None
    if measured:
        return measured[0], f"{measured[0]:.1f} a page: the mean of {measured[1]} pages extracted ok under --output"
    return float(max_tokens), f"--max-tokens {max_tokens} a page (an upper bound)"


def hosted_prices(to_model: Sequence[PagePlan], tokens: dict[str, int], prices: dict[str, Any]) -> list[dict[str, Any]]:
    """Each hosted API's list price for the pages, page by page as the ledger prices one (budget.hosted_cost)."""
    hosted = []
    out = tokens["output"] / len(to_model) if to_model else 0.0
    for name, p in prices["providers"].items():
        image = sum(budget.hosted_image_tokens(name, x.sent_width, x.sent_height, prices) for x in to_model)
        usd = sum(budget.hosted_cost(name, x.sent_width, x.sent_height, x.text_tokens, out, prices) for x in to_model)
        hosted.append({"provider": name, "image_family": p["image_family"], "image_tokens": image,
                       "input_tokens": image + tokens["text"], "output_tokens": tokens["output"], "usd": usd,
                       "usd_per_1k_pages": 1000 * usd / len(to_model) if to_model else 0.0})
    return hosted


def route_cost(cfg: ExtractConfig, self_hosted_usd: float, hosted: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What this run's `route` would cost (the ledger's `route` of its model pages): the in-process engine or a
    served endpoint at --gpu-hourly-usd, or a hosted API (--endpoint-kind hosted) at --api-price's list price."""
    route = cfg.route
    if route.startswith(API_ROUTE_PREFIX):
        provider = route.removeprefix(API_ROUTE_PREFIX)
        found = [h for h in hosted if h["provider"] == provider.removesuffix(budget.BATCH_TIER)]
        usd = found[0]["usd"] if found else 0.0
        basis = f"list price of {cfg.api_price} for the tokens above; the ledger counts the API's own usage"
        if found and provider.endswith(budget.BATCH_TIER):  # --engine openai_batch: the price rule's batch rate
            usd = budget.api_cost_usd(provider, found[0]["input_tokens"], found[0]["output_tokens"], cfg.prices)
            basis = (f"batch price of {cfg.api_price} (its batch_rate in schemas/prices.json) for the tokens above; "
                     "the ledger counts the batch API's own usage")
    elif cfg.gpu_hourly_usd > 0:
        usd, basis = self_hosted_usd, f"GPU-hours at ${cfg.gpu_hourly_usd:g}/h" + (
            "; a served endpoint: the ledger prices its measured busy time" if route == "served" else "")
    else:
        usd, basis = 0.0, "zero: --gpu-hourly-usd 0, the endpoint's cost is not counted"
    return {"route": route, "usd": usd, "basis": basis}


def estimate(o: PagemillOptions, storage: StorageConfig, *, pages_per_second: float | None = None,
             output_tokens: float | None = None, read_text: bool = True, workers: int = 8,
             per_page: bool = False, sample_pages: int = 200, sample_seed: int = 0) -> dict[str, Any]:
    """The whole estimate as one JSON-ready dict, from the run's own settings (pipelines/run/settings.py: the same
    pass as the run's, loading the schema and the image-token rule once); nothing else of `o` is read. Raises
    ValueError with the problems of options the settings cannot be built from."""
    t0 = time.perf_counter()
    run = run_settings(o, extract=True)  # what a run that extracts would use
    cfg = run.extract
    assert cfg is not None  # the estimate's settings always hold what a run that extracts would use
    schema, markdown, rule, prices = cfg.schema, cfg.markdown, cfg.model_family, cfg.prices
    throughput = load_throughput(cfg.model, pages_per_second)
    t_setup = time.perf_counter()  # the schema check imports the grammar compiler: seconds, once
    objects = list_matching(run.inputs, *run.window)
    t_list = time.perf_counter()
    settings = ScanSettings(run.intake, run.render.dpi, run.render.max_side, run.render.max_page_points,
                            run.render.max_text_chars, read_text, run.read)
    scanned = scan(objects, settings, workers)
    t_scan = time.perf_counter()
    dup = duplicates(scanned)
    kept = [d for d in scanned if d.status == "accepted" and d.uri not in dup]
    key = CacheKeyParts(run.tenant, cfg.model, cfg.model_revision, schema.schema_hash)
    cached = cached_documents(run.output, storage, {d.doc_sha256: len(d.pages) for d in kept if d.doc_sha256},
                              key) if run.output else set()
    out_figure, out_source = output_figure(run.output, cfg.max_tokens, storage, key, output_tokens)
    prompt = PromptTokens(cfg.model, cfg.model_revision, schema, markdown, cfg.prompt_layout)
    policy = HintPolicy.of(run.hints)
    todo = [d for d in kept if d.doc_sha256 not in cached]
    t_prompt = time.perf_counter()
    decisions = render_decisions(todo, run, policy.detail, policy.hints, sample_pages, sample_seed)
    t_render = time.perf_counter()
    plans = plan_pages(todo, run, cfg, prompt, policy, decisions)
    t_plan = time.perf_counter()
    to_model = [p for p in plans if p.status == "model"]
    tokens = {"image": sum(p.image_tokens for p in to_model), "text": sum(p.text_tokens for p in to_model),
              "output": round(out_figure * len(to_model)),
              "image_at_high_detail": sum(p.high_detail_image_tokens for p in to_model)}
    gpu_hours = len(to_model) / throughput.pages_per_s / 3600
    hints = (f"hints (--hints {policy.hints}): the PDF text layer where there is one; OCR text is not counted"
             if read_text else "text layers not read (--read-text false)")
    assumptions = [
        f"image tokens: {rule.family} estimator ({rule.source}) on the page sizes the page stage would produce "
        f"(--dpi {run.render.dpi:g}, --max-side {run.render.max_side})",
        f"result cache: documents whose every page has a reusable row under {run.output} for the same tenant, model, "
        "revision and schema (a document-level check)" if run.output else "result cache: not applied (no --output)",
        f"text tokens: {prompt.method}; {hints}",
        f"detail (--detail {policy.detail}): " + (decisions.method if decisions else
                                                  DETAIL_NOTES.get(policy.detail, policy.detail).format(
                                                      side=policy.low_detail_side)),
        f"output tokens: {out_source}",
        f"self-hosted throughput: {throughput.pages_per_s:g} pages/s, {throughput.source}",
        NOT_COUNTED, HOSTED_NOTE]
    rejected = Counter(d.reason_code for d in scanned if d.status == REJECTED)
    failed = Counter(p.reason_code for p in plans if p.status == FAILED)
    usd = gpu_hours * cfg.gpu_hourly_usd
    hosted = hosted_prices(to_model, tokens, prices)
    report: dict[str, Any] = {
        "inputs": list(run.inputs), "schema": schema.schema_id, "model": cfg.model, "model_family": rule.family,
        "documents": {"listed": len(scanned), "rejected": sum(rejected.values()), "reject_reasons": dict(rejected),
                      "duplicate": len(dup), "cached": len(cached), "to_extract": len(kept) - len(cached)},
        "pages": {"in_accepted_documents": sum(len(d.pages) for d in scanned if d.status == "accepted"),
                  "duplicate": sum(len(d.pages) for d in scanned if d.uri in dup),
                  "cached": sum(len(d.pages) for d in kept if d.doc_sha256 in cached),
                  "failed_before_model": dict(failed), "to_model": len(to_model)},
        "tokens": tokens, "detail": detail_summary(to_model, decisions, policy.detail),
        "self_hosted": {"pages_per_s": throughput.pages_per_s, "throughput_source": throughput.source,
                        "gpu_hours": gpu_hours, "gpu_hourly_usd": cfg.gpu_hourly_usd, "usd": usd,
                        "usd_per_1k_pages": 1000 * usd / len(to_model) if to_model else 0.0},
        "hosted": hosted, "route": route_cost(cfg, usd, hosted), "prices_read_on": prices.get("read_on"),
        "assumptions": assumptions,
        "timing": {"setup_s": round(t_setup - t0, 3), "list_s": round(t_list - t_setup, 3),
                   "scan_s": round(t_scan - t_list, 3), "render_s": round(t_render - t_prompt, 3),
                   "plan_s": round((t_prompt - t_scan) + (t_plan - t_render), 3),  # cache, tokenizer, plan
                   "total_s": round(time.perf_counter() - t0, 3),
                   "bytes_read": sum(d.size for d in scanned if d.doc_sha256), "workers": workers},
    }
    if per_page:
        report["per_page"] = [asdict(p) for p in plans]
    return report
