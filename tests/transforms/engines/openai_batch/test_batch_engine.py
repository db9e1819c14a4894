"""The batch engine (transforms/engines/openai_batch/engine.py): answers from collected results, spools what has
none (once, and never what a recorded batch holds), and gives each attempt of a page its own custom_id."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.reasons import BATCH_CANCELLED, BATCH_EXPIRED, BATCH_PENDING, INVALID_RESPONSE
from tests.support.served_faults import ANSWER, SCHEMA, page_task
from transforms.engines.base import PageRequest, PageSource, PromptParts, RequestFailed, Sampling, TokenBudget
from transforms.engines.openai_batch import files
from transforms.engines.openai_batch.engine import OpenAIBatchEngine
from transforms.engines.openai_batch.settings import OpenAIBatchSettings
from transforms.model.prompt import json_prompt

SAMPLING = Sampling(0.0, 1.0, 256, json=SCHEMA.schema)


def settings(tmp_path: Path) -> OpenAIBatchSettings:
    return OpenAIBatchSettings(endpoint="http://127.0.0.1:9/v1", model="gpt-4o", folder=str(tmp_path / "b"),
                               run_key="t/r")


def request(name: str) -> PageRequest:
    task = page_task(name, 300, 400)
    parts = PromptParts(json_prompt(SCHEMA.schema), "invoice", f"hint {name}")
    return PageRequest(PageSource(task.page.image, 0), parts, TokenBudget(8192, 256, "qwen2_vl"))


def spooled(s: OpenAIBatchSettings) -> list[dict]:
    return [json.loads(line) for uri in files.matching(s.folder, "spool") for line in files.read_lines(uri)]


def pending(engine: OpenAIBatchEngine, prepared: object, sampling: Sampling = SAMPLING) -> str:
    err = engine.submit(prepared, sampling).exception()  # type: ignore[arg-type]
    assert isinstance(err, RequestFailed)
    return err.reason_code


def test_unanswered_requests_are_spooled_once_and_answered_in_the_next_pass(tmp_path: Path) -> None:
    s = settings(tmp_path)
    engine = OpenAIBatchEngine(s)
    a, b = engine.prepare(request("a")), engine.prepare(request("b"))
    assert pending(engine, a) == pending(engine, b) == BATCH_PENDING
    assert not spooled(s)  # held until shutdown (or a full spool file)
    engine.shutdown()
    lines = spooled(s)
    assert [line["url"] for line in lines] == ["/v1/chat/completions"] * 2
    assert all(line["body"]["model"] == "gpt-4o" and line["body"]["response_format"]["type"] == "json_schema"
               for line in lines)
    first = lines[0]["custom_id"]
    usage = {"prompt_tokens": 900, "completion_tokens": 30}
    files.write_lines(files.result_file(s.folder, "batch-1"), [json.dumps({"custom_id": first, "body": {
        "choices": [{"message": {"content": json.dumps(ANSWER)}, "finish_reason": "stop"}], "usage": usage}}).encode()])
    again = OpenAIBatchEngine(s)  # the next pass: the same pages make the same ids
    a2, b2 = again.prepare(request("a")), again.prepare(request("b"))
    answers = [again.submit(p, SAMPLING) for p in (a2, b2)]
    done = [f for f in answers if f.exception() is None]
    assert len(done) == 1 and json.loads(done[0].result().output.text) == ANSWER
    assert done[0].result().output.text_tokens + done[0].result().output.image_tokens == 900
    again.shutdown()
    assert len(spooled(s)) == 3  # only the unanswered page was spooled again (the driver drops repeats)


def test_each_attempt_has_its_own_custom_id(tmp_path: Path) -> None:
    s = settings(tmp_path)
    engine = OpenAIBatchEngine(s)
    prepared = engine.prepare(request("a"))
    for _ in range(3):  # attempts 2 and 3 have the same decoding settings, not the same id
        pending(engine, prepared, Sampling(0.7, 0.9, 256, json=SCHEMA.schema))
    engine.shutdown()
    assert len({line["custom_id"] for line in spooled(s)}) == 3


def test_recorded_requests_wait_and_final_failures_and_bad_answers_end_the_page(tmp_path: Path) -> None:
    s = settings(tmp_path)
    probe = OpenAIBatchEngine(s)
    for name in "abc":
        pending(probe, probe.prepare(request(name)))
    probe.shutdown()
    ids = [line["custom_id"] for line in spooled(s)]
    files.delete(files.matching(s.folder, "spool"))
    state = files.empty_state("t/r")
    state["entries"].append({"fingerprint": "f", "custom_ids": ids, "batch_id": "batch-1", "status": "in_progress"})
    files.save_state(s.folder, state)
    files.write_lines(files.result_file(s.folder, "batch-1"), [
        json.dumps({"custom_id": ids[0], "failed": BATCH_EXPIRED, "message": "expired"}).encode(),
        json.dumps({"custom_id": ids[1], "body": {"choices": []}}).encode()])
    engine = OpenAIBatchEngine(s)
    reasons = [pending(engine, engine.prepare(request(name))) for name in "abc"]
    assert reasons == [BATCH_EXPIRED, INVALID_RESPONSE, BATCH_PENDING]
    engine.shutdown()
    assert not spooled(s)  # the third waits in its recorded batch: not spooled again
    state["cancelled"] = True
    files.save_state(s.folder, state)
    cancelled = OpenAIBatchEngine(s)
    assert pending(cancelled, cancelled.prepare(request("new"))) == BATCH_CANCELLED


def test_a_state_of_another_run_is_refused(tmp_path: Path) -> None:
    s = settings(tmp_path)
    files.save_state(s.folder, files.empty_state("t/other"))
    with pytest.raises(ValueError, match="belongs to run"):
        OpenAIBatchEngine(s).start()


def test_make_builds_the_batch_engine_of_its_kind(tmp_path: Path) -> None:
    from transforms.engines import make

    s = settings(tmp_path)
    assert s.kind == "openai_batch" and type(make(s)) is OpenAIBatchEngine
