"""A run's partitions: compaction of a resumed run, tenants kept apart, the one line of a failed run, and an
output root that is a path, never a pattern (issue 22: `out[12]` reached out1/ and out2/)."""
from __future__ import annotations

import datetime as dt
import errno
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import cli
from pipelines.run.failure import run_failure
from pipelines.tables import sql
from schemas import tables
from schemas.layout import partition
from tests.support import docmaker
from tests.support.attempts import SPEND, STARTED, page, spend, write_attempt
from transforms.store.compaction import clear_run, compact_run
from transforms.store.files import run_files, run_tenants, tenant_files
from transforms.store.write import write_rows


def test_compact_run_keeps_the_latest_row_per_key(tmp_path: Path) -> None:
    out = str(tmp_path)
    early, late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    folder = partition(out, "documents", "t", "r")
    row = {"run_id": "r", "tenant": "t"}
    write_rows(folder, tables.DOCUMENTS, [{**row, "source_uri": "a", "outcome": "failed", "created_at": early},
                                          {**row, "source_uri": "b", "outcome": "rejected", "created_at": early}])
    write_rows(folder, tables.DOCUMENTS, [{**row, "source_uri": "a", "outcome": "extracted", "created_at": late}])
    assert compact_run(out, "t", "r") == {"documents": 2}
    (only,) = run_files(out, "documents", "t", "r")
    rows = {r["source_uri"]: r["outcome"] for r in pq.read_table(only).to_pylist()}
    assert rows == {"a": "extracted", "b": "rejected"}


def test_compaction_keeps_the_row_that_did_the_work_over_a_later_cached_copy(tmp_path: Path) -> None:
    early, late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    folder = partition(str(tmp_path), "ledger", "t", "r")
    key = {"run_id": "r", "tenant": "t", "doc_sha256": "d", "page_index": 0}
    write_rows(folder, tables.LEDGER, [{**key, "route": "model", "cost_usd": 0.5, "created_at": early}])
    write_rows(folder, tables.LEDGER, [{**key, "route": "cache", "cost_usd": 0.0, "created_at": late}])
    compact_run(str(tmp_path), "t", "r")
    (only,) = run_files(str(tmp_path), "ledger", "t", "r")
    assert [(r["route"], r["cost_usd"]) for r in pq.read_table(only).to_pylist()] == [("model", 0.5)]


ANSWERED = page("a", 0, "ok", extraction='{"total": 12}')
TIMED_OUT = page("a", 0, "failed", reason_code="engine_timeout", message="no answer within 60 s")
ANSWERED_COST = (1000, 50, 40, 1, 1.5, 0.25, 0.01)
TIMED_OUT_COST = (1000, 50, 0, 2, 4.0, 0.5, 0.02)
# Both attempts' spend, by hand: 1000+1000, 50+50, 40+0, 1+2, 1.5+4.0, 0.25+0.5, 0.01+0.02.
BOTH_COST = (2000, 100, 40, 3, 5.5, 0.75, 0.03)


@pytest.mark.parametrize("ok_file_first", [True, False], ids=["ok-file-sorts-first", "ok-file-sorts-last"])
@pytest.mark.parametrize("ok_attempt_first", [True, False], ids=["retry-timed-out", "retry-answered"])
def test_a_replayed_page_keeps_ok_whichever_file_sorts_first_and_the_ledger_keeps_both_attempts_spend(
        tmp_path: Path, ok_file_first: bool, ok_attempt_first: bool) -> None:
    # Fails before the fix: every row of the invocation had one created_at, so the file that sorted last won
    # (a `failed/engine_timeout` row replaced the answer), and the ledger kept one attempt's spend.
    out = str(tmp_path)
    attempts = [(ANSWERED, "model", ANSWERED_COST), (TIMED_OUT, "failed", TIMED_OUT_COST)]
    for pages_row, route, cost in attempts if ok_attempt_first else attempts[::-1]:
        name = f"part-{'0' if (pages_row is ANSWERED) == ok_file_first else '1'}.parquet"
        write_attempt(out, "pages", [pages_row], name)
        write_attempt(out, "ledger", [spend("a", 0, route, cost)], name)
    con = sql.connect(out, tenant="t", typed=False)  # the views keep the same row, before compaction
    try:
        viewed = {t: con.sql(f"SELECT * FROM {t}").to_arrow_table().to_pylist() for t in ("pages", "ledger")}
    finally:
        con.close()
    assert compact_run(out, "t", "r") == {"pages": 1, "ledger": 1}
    for table in ("pages", "ledger"):
        (only,) = run_files(out, table, "t", "r")
        (kept,) = pq.read_table(only).to_pylist()
        assert viewed[table] == [kept]
        if table == "pages":
            assert (kept["status"], kept["extraction"], kept["reason_code"]) == ("ok", '{"total": 12}', None)
        else:
            assert kept["route"] == "model"
            assert tuple(kept[c] for c in SPEND) == pytest.approx(BOTH_COST)


@pytest.mark.parametrize("later_file_first", [True, False], ids=["later-sorts-first", "later-sorts-last"])
def test_among_equals_the_later_attempt_wins_whichever_file_sorts_first(tmp_path: Path, later_file_first: bool) -> None:
    out = str(tmp_path)
    for n, sorts_first in ((1, not later_file_first), (2, later_file_first)):  # two answers, in this order
        name = f"part-{int(not sorts_first)}.parquet"
        write_attempt(out, "pages", [page("a", 0, "ok", extraction=f'{{"n": {n}}}')], name)
    con = sql.connect(out, tenant="t", typed=False)
    try:
        (viewed,) = con.execute("SELECT extraction FROM pages").fetchall()
    finally:
        con.close()
    compact_run(out, "t", "r")
    (only,) = run_files(out, "pages", "t", "r")
    assert [r["extraction"] for r in pq.read_table(only).to_pylist()] == [viewed[0]] == ['{"n": 2}']


def test_compaction_keeps_every_page_of_multi_page_documents(tmp_path: Path) -> None:
    """Keys keep page_index: a retried bundle of two 3-page documents compacts to 6 rows, none collapsed."""
    out = str(tmp_path)
    first = [page(d, i, "failed" if (d, i) == ("a", 1) else "ok", extraction="{}") for d in "ab" for i in range(3)]
    retry = [page("a", i, "ok", extraction="{}") for i in range(3)]  # document a's bundle, run again
    write_attempt(out, "pages", first, "part-1.parquet")
    write_attempt(out, "pages", retry, "part-0.parquet")
    each = (10, 2, 3, 1, 0.5, 0.125, 0.25)
    write_attempt(out, "ledger", [spend(r["doc_sha256"], r["page_index"], "model", each) for r in first],
                  "part-1.parquet")
    write_attempt(out, "ledger", [spend("a", i, "model", each) for i in range(3)], "part-0.parquet")
    assert compact_run(out, "t", "r") == {"pages": 6, "ledger": 6}
    (pages,) = (pq.read_table(f).to_pylist() for f in run_files(out, "pages", "t", "r"))
    assert sorted((r["doc_sha256"], r["page_index"], r["status"]) for r in pages) == [
        (d, i, "ok") for d in "ab" for i in range(3)]
    (ledger,) = (pq.read_table(f).to_pylist() for f in run_files(out, "ledger", "t", "r"))
    costs = {(r["doc_sha256"], r["page_index"]): r["cost_usd"] for r in ledger}
    # Document a's pages ran twice (0.125 each time), document b's once.
    assert costs == {("a", 0): 0.25, ("a", 1): 0.25, ("a", 2): 0.25, ("b", 0): 0.125, ("b", 1): 0.125,
                     ("b", 2): 0.125}


def test_compaction_reads_files_written_before_attempt_seq(tmp_path: Path) -> None:
    """An older release's file (no attempt_seq column) beside this one's: it reads as null and ranks below a
    numbered attempt of the same invocation; both attempts' spend stays counted."""
    out = str(tmp_path)
    older = pa.schema([f for f in tables.LEDGER if f.name != "attempt_seq"])
    folder = partition(out, "ledger", "t", "r")
    base = {"run_id": "r", "tenant": "t", "created_at": STARTED}
    write_rows(folder, older, [{**base, **spend("a", 0, "model", ANSWERED_COST), "stop_reason": "length"}],
               name="part-9.parquet")
    write_attempt(out, "ledger", [{**spend("a", 0, "model", TIMED_OUT_COST), "stop_reason": "stop"}],
                  "part-0.parquet")
    compact_run(out, "t", "r")
    (only,) = run_files(out, "ledger", "t", "r")
    (kept,) = pq.read_table(only).to_pylist()
    assert kept["stop_reason"] == "stop" and kept["attempt_seq"] is not None
    assert tuple(kept[c] for c in SPEND) == pytest.approx(BOTH_COST)


def test_partitions_keep_tenants_apart(tmp_path: Path) -> None:
    """Two tenants with one run id: each sees, compacts and clears its own partition only."""
    out = str(tmp_path)
    assert partition(out, "pages", "acme", "r1") == str(tmp_path / "pages" / "tenant=acme" / "run_id=r1")
    for tenant in ("acme", "globex"):
        for outcome in ("failed", "extracted"):  # two files each: compaction has work to do
            write_rows(partition(out, "documents", tenant, "r1"), tables.DOCUMENTS,
                       [{"run_id": "r1", "tenant": tenant, "source_uri": "a", "outcome": outcome}])
    assert run_tenants(out, "r1") == {"acme", "globex"} and run_tenants(out, "r2") == set()
    globex = run_files(out, "documents", "globex", "r1")
    assert len(globex) == 2 and all("/tenant=globex/" in f for f in globex)
    assert compact_run(out, "acme", "r1") == {"documents": 1}
    assert len(run_files(out, "documents", "acme", "r1")) == 1
    assert run_files(out, "documents", "globex", "r1") == globex  # untouched
    assert clear_run(out, "acme", "r1") == 1
    assert run_files(out, "documents", "acme", "r1") == [] and run_files(out, "documents", "globex", "r1") == globex
    assert tenant_files(out, "documents", "globex") == globex and tenant_files(out, "documents", "acme") == []
    assert tenant_files(str(tmp_path / "nothing-yet"), "pages", "acme") == []


def test_run_failure_names_the_root_cause_in_one_line() -> None:
    disk = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/pages/run_id=r/part-1.parquet.inprogress")
    try:
        try:
            raise disk
        except OSError as inner:
            raise RuntimeError("OSError: [Errno 28] ... [while running 'Write/WritePages/Write0']") from inner
    except RuntimeError as wrapped:
        line = run_failure(wrapped)
    assert line.startswith("no space left on the output's storage") and "part-1.parquet.inprogress" in line
    # A runner in another process passes only the text of the worker's error.
    remote = RuntimeError("Traceback ...\nOSError: [Errno 28] No space left on device: '/x'\n")
    assert run_failure(remote) == "no space left on the output's storage"
    other = run_failure(RuntimeError("ValueError: bad thing\n  more lines"))
    assert other == "RuntimeError: ValueError: bad thing" and "\n" not in other
    # A multi-process DirectRunner's error: the worker's whole traceback, the cause on its last exception line.
    trace = RuntimeError("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nZeroDivisionError: "
                         "division by zero\n\nDuring handling of the above exception, another exception occurred:"
                         "\n\nTraceback (most recent call last):\n  File \"y.py\"\nZeroDivisionError: division by "
                         "zero [while running 'Raise']\n\n")
    assert run_failure(trace) == "ZeroDivisionError: division by zero [while running 'Raise']"


def sibling_roots(tmp_path: Path) -> dict[Path, list[Path]]:
    """Run r of tenant default in out1/ and out2/ (two part files each), the roots `out[12]` would match as a glob."""
    found = {}
    for name in ("out1", "out2"):
        for outcome in ("failed", "extracted"):
            write_rows(partition(str(tmp_path / name), "documents", "default", "r"), tables.DOCUMENTS,
                       [{"run_id": "r", "tenant": "default", "source_uri": f"{name}/a.pdf", "outcome": outcome}])
        found[tmp_path / name] = sorted((tmp_path / name).rglob("*.parquet"))
    return found


@pytest.mark.parametrize("force", [True, False], ids=["force", "resume"])
def test_an_output_root_with_glob_characters_is_refused_and_touches_no_other_root(
        tmp_path: Path, force: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Fails before the fix: with --force run r's partitions in out1/ and out2/ were deleted; without it the run
    # said "resuming", merged their rows into out[12] and deleted the originals.
    siblings = sibling_roots(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(docmaker.multipage_pdf(1))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", "--input", "in", "--output", "out[12]", "--run-id", "r", "--extract", "false",
                     "--hints", "none", "--workers", "1", "--progress-every-s", "0", *(["--force"] if force else [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--output 'out[12]': an output root is a path, not a pattern, and may not hold [" in err, err
    assert not (tmp_path / "out[12]").exists()  # nothing written
    for root, files in siblings.items():
        assert sorted(root.rglob("*.parquet")) == files
        assert {r["outcome"] for f in files for r in pq.read_table(f).to_pylist()} == {"failed", "extracted"}


@pytest.mark.parametrize("root", ["out[12]", "out*", "out?"])
def test_the_partition_functions_never_glob_a_root(tmp_path: Path, root: str) -> None:
    # Below the command line too: whoever calls them with such a root gets an error, and no file goes.
    siblings = sibling_roots(tmp_path)
    output = str(tmp_path / root)
    for call in (lambda: clear_run(output, "default", "r"), lambda: compact_run(output, "default", "r"),
                 lambda: run_files(output, "documents", "default", "r"), lambda: run_tenants(output, "r"),
                 lambda: tenant_files(output, "documents", "default")):
        with pytest.raises(ValueError, match="is a path, not a pattern"):
            call()
    assert all(sorted(root.rglob("*.parquet")) == files for root, files in siblings.items())
    assert len(run_files(str(tmp_path / "out1"), "documents", "default", "r")) == 2  # a plain root still lists
