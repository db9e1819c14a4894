"""Drill: S3 that returns 500s and throttles. A real S3 server (moto on loopback) behind a fault-injecting
proxy (tests/support/s3_faults.py). Faults that pass are retried and the run ends with every row right; an object
whose reads keep failing past --s3-max-attempts ends as a `documents` row with `storage_error` (a system
failure: exit code 1), and the run goes on without losing any other document."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines import cli
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows
from tests.support.s3_faults import INTERNAL_ERROR, SLOW_DOWN, FaultProxy

pytest.importorskip("moto")
from tests.support.moto_s3 import make_bucket, start_moto, stop_moto

S3 = {"key": "testing", "secret": "testing", "region": "us-east-1"}
OBJECTS = {"in/invoice.pdf": docmaker.invoice_pdf(), "in/report.pdf": docmaker.multipage_pdf(3),
           "in/scan.png": docmaker.scanned_png(), "in/doomed.pdf": docmaker.multipage_pdf(2, title="Doomed")}


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    proc, endpoint = start_moto()
    yield endpoint
    stop_moto(proc)


def every_other(op: str, key: str, seen: int) -> int | None:
    """The 1st, 3rd, ... request of each listing and each object read fails, by turns 500 and 503 SlowDown:
    intake's read and the render stage's read of the same object each meet a fault."""
    if op not in ("list", "get") or seen % 2 == 0:
        return None
    return INTERNAL_ERROR if (seen // 2) % 2 == 0 else SLOW_DOWN


def doomed_at_intake(op: str, key: str, seen: int) -> int | None:
    if op == "get" and key.endswith("/in/doomed.pdf"):
        return SLOW_DOWN  # throttled for good
    return every_other(op, key, seen)


def doomed_at_render(op: str, key: str, seen: int) -> int | None:
    if op == "get" and key.endswith("/in/doomed.pdf"):
        return None if seen == 1 else INTERNAL_ERROR  # intake reads it; every read after that fails
    return every_other(op, key, seen)


def run(bucket: str, proxy: FaultProxy, output: Path, *extra: str) -> int:
    return cli.main(["run", "--input", f"s3://{bucket}/in/", "--output", str(output), "--run-id", "f1",
                     "--extract", "false", "--hints", "text_layer", "--nsfw-classifier", "none",
                     "--progress-every-s", "0", "--s3-endpoint-url", proxy.url, "--s3-access-key-id", S3["key"],
                     "--s3-secret-access-key", S3["secret"], "--s3-region", S3["region"], "--workers", "1", *extra])


def documents(output: Path) -> dict[str, dict]:
    rows = one_row_per(raw_rows(output, "documents", "f1"), "source_uri")
    return {uri.split("/", 3)[3]: row for uri, row in rows.items()}


def test_transient_500s_and_throttling_are_retried(moto: str, tmp_path: Path) -> None:
    make_bucket({"endpoint": moto, **S3}, "flaky", OBJECTS)
    with FaultProxy(moto, every_other) as proxy:
        code = run("flaky", proxy, tmp_path / "out")
    # The premise: listing and every object read met both kinds of fault.
    assert {op for op, _key, _status in proxy.faults} == {"list", "get"}
    assert {status for _op, _key, status in proxy.faults} == {INTERNAL_ERROR, SLOW_DOWN}
    faulted_reads = {key.split("/", 1)[1] for op, key, _status in proxy.faults if op == "get"}
    assert faulted_reads == set(OBJECTS)
    assert code == 0
    docs = documents(tmp_path / "out")
    assert set(docs) == set(OBJECTS)
    assert {name: (d["outcome"], d["reason_code"]) for name, d in docs.items()} == {
        name: ("rendered", None) for name in OBJECTS}
    pages = raw_rows(tmp_path / "out", "pages", "f1")
    assert len(pages) == 1 + 3 + 1 + 2 and {p["status"] for p in pages} == {"rendered"}


@pytest.mark.parametrize("where", ["intake", "render"])
def test_an_object_that_keeps_failing_gets_a_storage_error_row(moto: str, tmp_path: Path, where: str) -> None:
    bucket = f"doomed-{where}"
    make_bucket({"endpoint": moto, **S3}, bucket, OBJECTS)
    rule, first_ok, error = ((doomed_at_intake, 0, "SlowDown") if where == "intake"
                             else (doomed_at_render, 1, "InternalError"))
    with FaultProxy(moto, rule) as proxy:
        code = run(bucket, proxy, tmp_path / "out", "--s3-max-attempts", "3")
    assert proxy.seen["get", f"{bucket}/in/doomed.pdf"] == first_ok + 3  # retried as configured, then given up
    docs = documents(tmp_path / "out")
    assert set(docs) == set(OBJECTS)  # nothing lost, nothing crashed
    doomed = docs.pop("in/doomed.pdf")
    assert (doomed["outcome"], doomed["reason_code"]) == ("failed", "storage_error"), doomed
    if where == "intake":
        assert error in doomed["message"]
    else:  # read at intake, then not at rendering: its pages are accounted for, with the store's answer
        pages = [p for p in raw_rows(tmp_path / "out", "pages", "f1") if p["source_uri"].endswith("doomed.pdf")]
        assert sorted((p["page_index"], p["reason_code"]) for p in pages) == [(0, "storage_error"),
                                                                             (1, "storage_error")]
        assert all(error in p["message"] for p in pages)
    assert {name: (d["outcome"], d["reason_code"]) for name, d in docs.items()} == {
        name: ("rendered", None) for name in docs}
    # One document in four failed for a system reason: over --max-failed-fraction 0.05.
    manifest = json.loads((tmp_path / "out" / "runs" / "tenant=default" / "f1.json").read_text())
    assert code == manifest["exit_code"] == 1
    assert "1 of 4 documents" in manifest["exit_reason"] and "system reasons" in manifest["exit_reason"]


def test_estimate_reads_as_the_run_does(moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pagemill estimate` reads objects with the run's reader: the same retries, the same reason code."""
    make_bucket({"endpoint": moto, **S3}, "estimate", OBJECTS)

    def rule(op: str, key: str, seen: int) -> int | None:
        # doomed.pdf: throttled for good. report.pdf: scanned, then throttled for good when read again to render.
        doomed = key.endswith("/in/doomed.pdf") or (key.endswith("/in/report.pdf") and seen > 1)
        return SLOW_DOWN if op == "get" and doomed else None

    with FaultProxy(moto, rule) as proxy:
        capsys.readouterr()
        code = cli.main(["estimate", "--format", "json", "--input", "s3://estimate/in/", "--pages-per-second", "1",
                         "--s3-max-attempts", "3", "--s3-endpoint-url", proxy.url, "--s3-access-key-id", S3["key"],
                         "--s3-secret-access-key", S3["secret"], "--s3-region", S3["region"]])
    assert code == 0
    assert proxy.seen["get", "estimate/in/doomed.pdf"] == 3  # retried as configured, then given up
    # The sample rendered to choose hints and detail is read again by the same reader: the same retries, the
    # same reason code, and the document keeps its extrapolated figure.
    assert proxy.seen["get", "estimate/in/report.pdf"] == 1 + 3
    report = json.loads(capsys.readouterr().out)
    assert report["detail"]["notes"] == ["s3://estimate/in/report.pdf: not read again (storage_error)"]
    assert report["detail"]["extrapolated_pages"] == 3  # report.pdf's pages
    documents = report["documents"]
    assert (documents["listed"], documents["rejected"], documents["reject_reasons"]) == (4, 1, {"storage_error": 1})
