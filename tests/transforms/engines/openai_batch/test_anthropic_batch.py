"""Anthropic's Message Batches behind the batch driver (transforms/engines/openai_batch/anthropic.py) against the
fake server's Anthropic routes (tests/support/fake_anthropic_batches.py): the engine's spooled request sent as Message
params with its page as a base64 image block, the key and version headers, an expired batch's finished half kept and
the rest resubmitted once, a cancel, a kill between create and record, and the translation of results."""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.reasons import BATCH_CANCELLED, BATCH_EXPIRED
from tests.support.fake_batch_server import FakeBatches, batch_server
from tests.support.served_faults import ANSWER, SCHEMA, page_task
from transforms.engines.base import PageRequest, PageSource, PromptParts, Sampling, TokenBudget
from transforms.engines.openai.answer import completion_output
from transforms.engines.openai_batch import files
from transforms.engines.openai_batch.anthropic import AnthropicBatchClient, completion, result_line
from transforms.engines.openai_batch.driver import BatchDriver
from transforms.engines.openai_batch.engine import OpenAIBatchEngine
from transforms.engines.openai_batch.settings import AnthropicBatchSettings
from transforms.model.prompt import json_prompt

KEY_ENV = "PAGEMILL_TEST_ANTHROPIC_KEY"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBatches:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    return FakeBatches(model="claude-sonnet-test", key="sk-ant-test")


@pytest.fixture
def api(fake: FakeBatches) -> Iterator[str]:
    with batch_server(fake) as url:
        yield url


def settings(api: str, tmp_path: Path, **changes: Any) -> AnthropicBatchSettings:
    values: dict[str, Any] = {"endpoint": api, "model": "claude-sonnet-test", "folder": str(tmp_path / "batches"),
                              "run_key": "t/a1", "api_key_env": KEY_ENV, "max_requests": 4, "backoff_s": 0.0,
                              "max_backoff_s": 0.0}
    return AnthropicBatchSettings(**{**values, **changes})


def driver(s: AnthropicBatchSettings, client: AnthropicBatchClient | None = None) -> BatchDriver:
    return BatchDriver(s, client or AnthropicBatchClient(s, sleep=lambda _: None))


def spool_pages(s: AnthropicBatchSettings, names: str) -> tuple[list[str], bytes]:
    """The real engine's requests for pages `names`, spooled; their custom_ids and the first page's JPEG."""
    engine = OpenAIBatchEngine(s)
    sampling = Sampling(0.0, 1.0, 256, json=SCHEMA.schema)
    first = b""
    for name in names:
        task = page_task(name, 300, 400)
        first = first or task.page.image
        parts = PromptParts(json_prompt(SCHEMA.schema), "invoice", f"hint {name}")
        engine.submit(engine.prepare(PageRequest(PageSource(task.page.image, 0), parts,
                                                 TokenBudget(8192, 256, "qwen2_vl"))), sampling)
    engine.shutdown()
    ids = [json.loads(line)["custom_id"] for uri in files.matching(s.folder, "spool") for line in files.read_lines(uri)]
    return ids, first


def results(s: AnthropicBatchSettings) -> dict[str, dict[str, Any]]:
    return {line["custom_id"]: line for line in files.results(s.folder)}


def test_spooled_requests_go_as_message_params_and_an_expired_half_is_resubmitted_once(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path)
    ids, jpeg = spool_pages(s, "abcd")
    assert driver(s).step().batches == 1
    (batch,) = fake.batches
    sent = fake.batches[batch]["_requests"]
    assert sorted(r["custom_id"] for r in sent) == sorted(ids)
    params = sent[0]["params"]
    assert params["model"] == "claude-sonnet-test" and params["max_tokens"] == 256 and params["temperature"] == 0.0
    assert "response_format" not in params and "top_p" not in params
    blocks = [b for m in params["messages"] for b in m["content"]]
    images = [b for b in blocks if b["type"] == "image"]
    assert len(images) == 1 and images[0]["source"]["media_type"] == "image/jpeg"
    assert base64.b64decode(images[0]["source"]["data"]) == jpeg  # the page's own bytes, untouched
    assert any("hint a" in b.get("text", "") for b in blocks) and params["system"]
    fake.run(batch, share=0.5, status="expired")
    step = driver(s).step()
    assert (step.collected, step.resubmitted, step.batches, step.working) == (1, 2, 1, 1)
    order = [r["custom_id"] for r in sent]
    again = next(b for b in fake.batches if b != batch)
    assert [r["custom_id"] for r in fake.batches[again]["_requests"]] == order[2:]
    fake.run(again)
    assert driver(s).step().working == 0
    final = results(s)
    assert sorted(c for c, r in final.items() if "body" in r) == sorted(ids)
    assert fake.received == {cid: 2 if cid in order[2:] else 1 for cid in ids}
    answer = completion_output(final[order[0]]["body"], 0, 256)  # the engine's own answer checks read it
    assert json.loads(answer.text) == ANSWER and answer.output_tokens == len(json.dumps(ANSWER)) // 4


def test_an_expired_request_past_its_resubmissions_fails_batch_expired(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path, max_resubmits=0)
    spool_pages(s, "ab")
    driver(s).step()
    (batch,) = fake.batches
    fake.run(batch, share=0.5, status="expired")
    assert driver(s).step().failed == 1
    assert [r.get("failed") for r in results(s).values()].count(BATCH_EXPIRED) == 1


def test_cancel_keeps_what_finished_and_fails_the_rest_cancelled(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path)
    spool_pages(s, "abcd")
    driver(s).step()
    (batch,) = fake.batches
    assert driver(s).cancel() == [batch]
    assert fake.batches[batch]["processing_status"] == "canceling"
    fake.run(batch, share=0.5, status="cancelled")
    step = driver(s).step()
    assert (step.collected, step.resubmitted, step.working) == (1, 0, 0)
    final = results(s)
    assert sum("body" in r for r in final.values()) == 2
    assert sorted(r["failed"] for r in final.values() if "failed" in r) == [BATCH_CANCELLED] * 2


def test_a_wrong_key_is_refused_and_nothing_is_recorded_as_sent(
        api: str, fake: FakeBatches, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-wrong")
    s = settings(api, tmp_path)
    spool_pages(s, "a")
    step = driver(s).step()
    assert (step.batches, step.working) == (0, 1) and not fake.batches  # recorded, waits for the next step


class KilledAfterCreate(AnthropicBatchClient):
    def submit(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        super().submit(*args, **kwargs)
        raise KeyboardInterrupt("killed")


def test_a_kill_between_create_and_record_adopts_the_batch_by_its_time_and_size(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path, max_requests=2)
    ids, _ = spool_pages(s, "abc")  # a batch of 2, then one of 1
    with pytest.raises(KeyboardInterrupt):
        driver(s, KilledAfterCreate(s, sleep=lambda _: None)).step()
    assert len(fake.batches) == 1
    step = driver(s).step()  # adopts the first, creates the second
    assert (step.batches, step.working) == (1, 2) and len(fake.batches) == 2
    state = files.load_state(s.folder, "t/a1")
    assert sorted(e["batch_id"] for e in state["entries"]) == sorted(fake.batches)
    assert fake.received == {cid: 1 for cid in ids}


def test_results_lines_become_openai_lines() -> None:
    message = {"content": [{"type": "text", "text": "{"}, {"type": "text", "text": "}"}], "stop_reason": "max_tokens",
               "usage": {"input_tokens": 900, "output_tokens": 7, "cache_read_input_tokens": 100}}
    body = completion(message)
    answer = completion_output(body, 50, 256)
    assert (answer.text, answer.finish_reason, answer.output_tokens) == ("{}", "length", 7)
    assert answer.image_tokens + answer.text_tokens == 1000 and answer.cached_prompt_tokens == 100
    assert completion({"content": "not blocks"}) == {"choices": []}
    expired = result_line({"custom_id": "x", "result": {"type": "expired"}})
    assert expired["error"]["code"] == BATCH_EXPIRED
    errored = result_line({"custom_id": "y", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "overloaded_error", "message": "busy"}}}})
    assert errored["error"] == {"code": "overloaded_error", "message": "busy"}
