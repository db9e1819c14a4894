"""The engine feed (transforms/extract/feed.py) over a simulated engine: bounds, attempts, faults.
The same feed runs over vLLM in tests/transforms/extract/test_extract.py."""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

from schemas.extraction import load_schema
from tests.support.feed_setup import ENGINE, Counting, config, page, tasks
from tests.support.feeding import extract_all
from transforms.engines.base import EngineDead, RequestRejected, Sampling
from transforms.engines.simulated import PAGE_TEXT, SimulatedEngine
from transforms.engines.vllm_local.vllm_args import engine_sequences
from transforms.extract.feed import PageFeed, sampling, stop_reason
from transforms.extract.stage import in_flight_limit, make_task
from transforms.model.markdown import MARKDOWN_FORMATS


def test_pages_in_flight_stay_bounded_and_all_finish() -> None:
    engine = Counting(slots=2, seconds=0.01)
    results = extract_all(engine, tasks(30, config()), config(), max_in_flight=5)
    assert [r.status for r in results] == ["ok"] * 30
    assert 2 < engine.peak <= 5  # the engine had more than its slots queued, never more than the bound
    assert all(r.extraction == PAGE_TEXT and r.attempts == 1 and r.finished_at for r in results)
    assert all(r.gpu_seconds > 0 for r in results)
    assert engine.submitted == 30


def test_in_flight_limit_follows_max_num_seqs() -> None:
    assert in_flight_limit(config(), engine_sequences(ENGINE, cpu=False)) == 8
    assert in_flight_limit(config(), engine_sequences(replace(ENGINE, max_num_seqs=256), cpu=True)) == 32  # CPU: 16
    assert in_flight_limit(config(max_in_flight=3), engine_sequences(ENGINE, cpu=False)) == 3


def test_a_key_in_flight_is_claimed_once() -> None:
    feed = PageFeed(SimulatedEngine(seconds=0.01), config(), 4)
    first, is_first = feed.claim("k")
    again, is_again = feed.claim("k")
    assert is_first and not is_again and again is first
    assert feed.claim("other")[1]


def test_invalid_output_is_retried_then_reported() -> None:
    engine = SimulatedEngine(seconds=0.0, text='{"language": "english", "lines": [], "tables": []}')
    (r,) = extract_all(engine, tasks(1, config()), config())
    assert (r.status, r.reason_code, r.attempts) == ("invalid", "schema_invalid", 2)
    assert engine.submitted == 2 and r.extraction is None


class Rejecting(SimulatedEngine):
    def submit(self, prepared, sampling):
        if prepared.request["multi_modal_data"]["image"].width == 333:
            future: Future = Future()
            future.set_exception(RequestRejected("request rejected (injected)"))
            return future
        return super().submit(prepared, sampling)


def test_rejected_request_fails_alone_without_restart() -> None:
    cfg = config()
    engine = Rejecting(seconds=0.0)
    ok, bad = extract_all(engine, [make_task(page(1), cfg)[1], make_task(page(2, 333), cfg)[1]], cfg)
    assert ok.status == "ok"
    assert (bad.status, bad.reason_code, bad.attempts) == ("failed", "engine_error", 2)
    assert "injected" in (bad.message or "") and engine.starts == 1


class Dying(SimulatedEngine):
    """Every request in flight fails at once, as when the engine process dies, until restarted."""

    def submit(self, prepared, sampling):
        if self.starts == 1:
            future: Future = Future()
            future.set_exception(EngineDead("EngineCore died unexpectedly"))
            return future
        return super().submit(prepared, sampling)


def test_dead_engine_is_restarted_once_and_pages_resubmitted() -> None:
    engine = Dying(seconds=0.0)
    results = extract_all(engine, tasks(6, config()), config(), max_in_flight=6)
    assert [r.status for r in results] == ["ok"] * 6
    assert engine.starts == 2  # six failed requests, one restart
    assert all(r.attempts == 1 for r in results)  # a request lost with the engine is not an attempt


class NeverStarts(SimulatedEngine):
    def tokenizer(self):
        raise RuntimeError("no GPU (injected)")


def test_engine_that_cannot_start_fails_every_page_as_a_row() -> None:
    results = extract_all(NeverStarts(), tasks(3, config()), config(), max_in_flight=2)
    assert [(r.status, r.reason_code, r.attempts) for r in results] == [("failed", "engine_error", 0)] * 3
    assert all("could not start" in (r.message or "") for r in results)


def test_prompt_over_max_model_len_never_reaches_the_engine() -> None:
    engine = SimulatedEngine(seconds=0.0)
    cfg = config(max_model_len=300)
    (r,) = extract_all(engine, tasks(1, cfg), cfg)
    assert (r.status, r.reason_code, r.attempts) == ("failed", "over_token_budget", 0)
    assert engine.submitted == 0


class Stopping(SimulatedEngine):
    """Counts shutdowns; `broken` ones raise (and aborts too)."""

    def __init__(self, broken: bool = False, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.broken, self.shutdowns, self.abort_calls = broken, 0, 0

    def shutdown(self) -> None:
        self.shutdowns += 1
        if self.broken:
            raise RuntimeError("cannot stop (injected)")

    def abort(self, future) -> None:
        self.abort_calls += 1
        if self.broken:
            raise RuntimeError("cannot abort (injected)")
        super().abort(future)


def test_the_engine_stops_when_its_last_user_detaches() -> None:
    engine = Stopping()
    feed = PageFeed(engine, config(), 2)
    feed.attach()
    feed.attach()
    feed.detach()
    assert engine.shutdowns == 0  # another DoFn instance of the process still feeds it
    feed.detach()
    assert engine.shutdowns == 1
    broken = PageFeed(Stopping(broken=True), config(), 2)
    broken.attach()
    broken.detach()  # a failing shutdown at the end of a run is logged, not raised
    assert broken.engine.shutdowns == 1


def test_an_answer_past_its_timeout_ends_the_page_and_frees_its_sequence() -> None:
    for broken in (False, True):
        engine = Stopping(broken=broken, slots=1, seconds=3600.0)  # it would answer in an hour
        feed = PageFeed(engine, config(answer_timeout_s=0.2), 2)
        key, task = make_task(page(1), config(answer_timeout_s=0.2))
        result, _ = feed.claim(key)
        feed.slots.acquire()
        feed.start(task, result)
        r = result.result(timeout=60)
        assert (r.status, r.reason_code, r.stop_reason, r.attempts) == ("failed", "engine_timeout", "deadline", 1)
        assert r.message == "attempt 1: no answer within --answer-timeout-s 0.2 s"
        assert engine.abort_calls == 1 and engine.aborted == (0 if broken else 1)  # its sequence freed
        assert engine.starts == 1  # the aborted request is not read as a dead engine: no restart
        assert feed.slots.acquire(blocking=False) and feed.slots.acquire(blocking=False)  # its slot came back


def test_an_answer_in_time_is_not_aborted() -> None:
    engine = Stopping(seconds=0.01)
    (r,) = extract_all(engine, tasks(1, config(answer_timeout_s=30.0)), config(answer_timeout_s=30.0))
    assert (r.status, r.attempts, r.stop_reason) == ("ok", 1, "stop")
    assert engine.abort_calls == 0


class Recording(SimulatedEngine):
    """Keeps the Sampling of every attempt it is sent."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.samplings: list[Sampling] = []

    def submit(self, prepared, sampling):
        self.samplings.append(sampling)
        return super().submit(prepared, sampling)


def test_each_attempt_gets_its_decoding_and_the_schema_as_its_constraint() -> None:
    engine = Recording(seconds=0.0, text='{"language": "english", "lines": [], "tables": []}')  # always invalid
    (r,) = extract_all(engine, tasks(1, config()), config())
    schema = dict(load_schema("page_text").schema)
    # Greedy first (temperature 0, top_p 1), then the one sampled retry (0.7, 0.95): prompt.decoding's schedule.
    assert engine.samplings == [Sampling(0.0, 1.0, 256, json=schema), Sampling(0.7, 0.95, 256, json=schema)]
    assert r.attempts == 2


def test_markdown_attempts_are_constrained_by_the_front_matter_only() -> None:
    olmocr, plain = MARKDOWN_FORMATS["olmocr"], MARKDOWN_FORMATS["markdown"]
    assert sampling(olmocr.schema, 300, 1, olmocr) == Sampling(0.0, 1.0, 300, regex=olmocr.regex)
    assert olmocr.regex is not None and olmocr.regex.startswith("---\nprimary_language: ")
    assert sampling(plain.schema, 300, 2, plain) == Sampling(0.7, 0.95, 300)  # no front matter: unconstrained


def test_an_engine_finish_reason_is_a_stop_reason_only_when_it_ends_an_answer() -> None:
    assert [stop_reason(f) for f in ("stop", "length", "repetition", "abort", None, "STOP")] == \
        ["stop", "length", "repetition", None, None, None]


class InvalidThenValid(SimulatedEngine):
    """Answers the first attempt of each page with schema-invalid JSON, the next with the page's text."""

    INVALID = '{"language": "english", "lines": [], "tables": []}'

    def submit(self, prepared, sampling):
        self.text = self.INVALID if self.submitted == 0 else PAGE_TEXT
        return super().submit(prepared, sampling)


def test_a_retried_page_is_billed_for_every_answered_attempt() -> None:
    engine = InvalidThenValid(seconds=0.0)
    (r,) = extract_all(engine, tasks(1, config()), config())
    assert (r.status, r.attempts) == ("ok", 2)
    # What one attempt costs, counted here from the simulated engine's own rule (4 characters a token) and the
    # page's size: the ledger must hold both answers, as a hosted API bills them.
    one = extract_all(SimulatedEngine(seconds=0.0), tasks(1, config()), config())[0]
    assert r.output_tokens == max(1, len(InvalidThenValid.INVALID) // 4) + max(1, len(PAGE_TEXT) // 4)
    assert (r.image_tokens, r.text_tokens) == (2 * one.image_tokens, 2 * one.text_tokens)
    assert one.image_tokens > 0 and one.text_tokens > 0
