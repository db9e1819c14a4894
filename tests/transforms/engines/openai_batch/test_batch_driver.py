"""The launcher's batch step (transforms/engines/openai_batch/driver.py) against the fake Batch API
(tests/support/fake_batch_server.py): submit at the limits, every status, partial output, an error file, an expired
batch with half its results, a 429 on create, a 5xx on download, a results file larger than one read, a kill
between create and record, and cancel. Each custom_id's submissions are counted by the server."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.reasons import BATCH_CANCELLED, BATCH_EXPIRED, BATCH_FAILED
from tests.support.fake_batch_server import FakeBatches, batch_server
from transforms.engines.openai_batch import files
from transforms.engines.openai_batch.client import BatchClient, split_lines
from transforms.engines.openai_batch.driver import BatchDriver, chunks, summary
from transforms.engines.openai_batch.engine import batch_line
from transforms.engines.openai_batch.settings import OpenAIBatchSettings


@pytest.fixture
def fake() -> FakeBatches:
    return FakeBatches()


@pytest.fixture
def api(fake: FakeBatches) -> Iterator[str]:
    with batch_server(fake) as url:
        yield url


def settings(api: str, tmp_path: Path, **changes: Any) -> OpenAIBatchSettings:
    values: dict[str, Any] = {"endpoint": api, "model": "gpt-4o", "folder": str(tmp_path / "batches"),
                              "run_key": "t/r1", "max_requests": 3, "backoff_s": 0.0, "max_backoff_s": 0.0}
    return OpenAIBatchSettings(**{**values, **changes})


def driver(s: OpenAIBatchSettings) -> BatchDriver:
    return BatchDriver(s, BatchClient(s, sleep=lambda _: None))


def spool(s: OpenAIBatchSettings, ids: list[str], pad: int = 0) -> None:
    files.write_spool(s.folder, [batch_line(cid, {"model": "gpt-4o", "max_tokens": 64, "messages": [
        {"role": "user", "content": f"page {cid} " + "x" * pad}]}) for cid in ids])


def results(s: OpenAIBatchSettings) -> dict[str, dict[str, Any]]:
    return {line["custom_id"]: line for line in files.results(s.folder)}


IDS = [f"pm-{i:03d}" for i in range(7)]


def test_spooled_requests_become_batches_at_the_limit_and_a_second_step_submits_nothing(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path)
    spool(s, IDS)
    first = driver(s).step()
    assert (first.batches, first.submitted, first.working) == (3, 7, 3)  # 3 + 3 + 1 under --batch-max-requests 3
    assert sorted(len(fake.requests(b)) for b in fake.batches) == [1, 3, 3]
    assert not files.matching(s.folder, "spool")  # the spool is consumed once recorded
    again = driver(s).step()
    assert (again.batches, again.submitted, again.working) == (0, 0, 3)
    assert fake.received == {cid: 1 for cid in IDS}
    state = files.load_state(s.folder, "t/r1")
    assert sorted(e["batch_id"] for e in state["entries"]) == sorted(fake.batches)
    assert all(b["metadata"]["pagemill_run"] == "t/r1" for b in fake.batches.values())


def test_the_same_request_spooled_twice_or_by_two_workers_is_submitted_once(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path)
    spool(s, IDS[:2])
    spool(s, IDS[:3])
    driver(s).step()
    spool(s, IDS[:3])  # a later pass spools what a recorded batch already holds
    assert driver(s).step().submitted == 0
    assert fake.received == {cid: 1 for cid in IDS[:3]}


def test_expired_batch_keeps_its_half_and_resubmits_the_rest_once(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path, max_requests=10)
    spool(s, IDS[:6])
    driver(s).step()
    (first,) = fake.batches
    fake.run(first, share=0.5, status="expired")
    step = driver(s).step()
    assert (step.collected, step.resubmitted, step.batches, step.submitted) == (1, 3, 1, 3)
    answered = results(s)
    assert sorted(answered) == IDS[:3] and all("body" in r for r in answered.values())
    (second,) = fake.working()
    fake.run(second, share=0.0, status="expired")  # expires again: out of resubmissions
    step = driver(s).step()
    assert (step.resubmitted, step.failed, step.submitted, step.working) == (0, 3, 0, 0)
    final = results(s)
    assert {final[c]["failed"] for c in IDS[3:6]} == {BATCH_EXPIRED}
    assert fake.received == {**{c: 1 for c in IDS[:3]}, **{c: 2 for c in IDS[3:6]}}
    report = summary(files.load_state(s.folder, "t/r1"))
    assert (report["submitted"], report["finished"], report["expired"], report["failed"]) == (9, 3, 6, 3)


def test_every_status_of_a_batch(api: str, fake: FakeBatches, tmp_path: Path) -> None:
    """in_progress and finalizing wait; completed with request errors (an error file), failed at validation and
    cancelled by someone else end; misses are resubmitted once, then fail with their reason."""
    s = settings(api, tmp_path, max_requests=2)
    spool(s, IDS[:6])
    driver(s).step()
    a, b, c = sorted(fake.batches)
    fake.start(a, "in_progress")
    fake.start(b, "finalizing")
    assert driver(s).step().working == 3
    fake.errors_for = {fake.requests(a)[1]["custom_id"]}
    fake.run(a)  # completed: one answer, one request error
    fake.fail(b)  # failed validation: no files at all
    fake.run(c, share=0.5, status="cancelled")
    step = driver(s).step()
    assert (step.collected, step.resubmitted) == (3, 4)  # a's error, b's two, c's unrun one
    for batch in fake.working():
        fake.fail(batch)
    driver(s).step()
    final = results(s)
    assert sum("body" in r for r in final.values()) == 2
    assert sorted(r["failed"] for r in final.values() if "failed" in r) == [BATCH_FAILED] * 4
    assert len(final) == 6  # every request ends answered or failed, once


def test_429_on_create_is_retried_and_a_lasting_one_waits_for_the_next_step(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path, max_retries=1)
    fake.creates_429 = 1
    spool(s, IDS[:3])
    assert driver(s).step().batches == 1  # one 429, retried
    fake.creates_429 = 5
    spool(s, IDS[3:6])
    step = driver(s).step()
    assert (step.batches, step.working) == (0, 2)  # recorded, not yet created
    fake.creates_429 = 0
    assert driver(s).step().batches == 1
    assert fake.received == {cid: 1 for cid in IDS[:6]}


def test_5xx_on_download_is_retried_and_a_lasting_one_collects_at_the_next_step(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path, max_retries=1)
    spool(s, IDS[:3])
    driver(s).step()
    (batch,) = fake.batches
    fake.run(batch)
    fake.downloads_500 = 5
    step = driver(s).step()
    assert (step.collected, step.working) == (0, 1) and not results(s)
    fake.downloads_500 = 1
    assert driver(s).step().collected == 1
    assert sorted(results(s)) == IDS[:3]


def test_a_results_file_larger_than_one_read(api: str, fake: FakeBatches, tmp_path: Path) -> None:
    ids = [f"pm-{i:04d}" for i in range(400)]
    s = settings(api, tmp_path, max_requests=1000)
    spool(s, ids, pad=300)
    driver(s).step()
    (batch,) = fake.batches
    fake.run(batch)
    assert len(fake.files[fake.batches[batch]["output_file_id"]]) > 3 * 64 * 1024  # several reads of the client
    driver(s).step()
    assert sorted(results(s)) == ids


def test_lines_are_split_across_reads_of_any_size() -> None:
    data = b"".join(json.dumps({"n": i, "pad": "y" * (i % 7)}).encode() + b"\n" for i in range(50))
    for size in (1, 3, 17, 4096):
        pieces = (data[i:i + size] for i in range(0, len(data), size))
        assert [json.loads(line)["n"] for line in split_lines(pieces)] == list(range(50))
    assert list(split_lines(iter([b'{"a": 1}\n{"b"', b': 2}']))) == [b'{"a": 1}', b'{"b": 2}']


def test_chunks_keep_to_both_limits() -> None:
    lines = [b"x" * n for n in (5, 5, 5, 20, 1, 1)]
    assert [len(g) for g in chunks(lines, 2, 1000)] == [2, 2, 2]
    assert [[len(x) for x in g] for g in chunks(lines, 10, 12)] == [[5, 5], [5], [20], [1, 1]]


class KilledAfterCreate(BatchClient):
    """A launcher killed right after the provider created its batch, before the id was recorded."""

    def create(self, file_id: str, metadata: Any) -> dict[str, Any]:
        super().create(file_id, metadata)
        raise KeyboardInterrupt("killed")


def test_a_kill_between_create_and_record_adopts_the_batch_and_submits_nothing_twice(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path)
    spool(s, IDS[:3])
    with pytest.raises(KeyboardInterrupt):
        BatchDriver(s, KilledAfterCreate(s, sleep=lambda _: None)).step()
    assert len(fake.batches) == 1
    assert not files.load_state(s.folder, "t/r1")["entries"][0].get("batch_id")  # created, never recorded
    step = driver(s).step()
    assert (step.batches, step.working) == (0, 1)
    (entry,) = files.load_state(s.folder, "t/r1")["entries"]
    assert entry["batch_id"] == next(iter(fake.batches))
    assert fake.received == {cid: 1 for cid in IDS[:3]}


def test_a_batch_adopted_after_a_kill_that_has_ended_meanwhile_is_collected_not_sent_again(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path)
    spool(s, IDS[:3])
    with pytest.raises(KeyboardInterrupt):
        BatchDriver(s, KilledAfterCreate(s, sleep=lambda _: None)).step()
    (batch,) = fake.batches
    fake.run(batch)  # it ends before the launcher comes back
    step = driver(s).step()
    assert (step.batches, step.collected, step.resubmitted, step.working) == (0, 1, 0, 0)
    assert sorted(c for c, r in results(s).items() if "body" in r) == IDS[:3]
    assert fake.received == {cid: 1 for cid in IDS[:3]}


def test_cancel_stops_the_run_keeps_what_finished_and_fails_the_rest(
        api: str, fake: FakeBatches, tmp_path: Path) -> None:
    s = settings(api, tmp_path, max_requests=4)
    spool(s, IDS[:4])
    driver(s).step()
    (batch,) = fake.batches
    assert driver(s).cancel() == [batch]
    assert fake.batches[batch]["status"] == "cancelling"
    spool(s, IDS[4:])  # spooled after the cancel: never sent
    fake.run(batch, share=0.5, status="cancelled")
    step = driver(s).step()
    assert (step.submitted, step.resubmitted, step.working) == (0, 0, 0)
    final = results(s)
    assert sorted(c for c, r in final.items() if "body" in r) == IDS[:2]
    assert {final[c]["failed"] for c in IDS[2:4]} == {BATCH_CANCELLED}
    assert fake.received == {cid: 1 for cid in IDS[:4]}
