"""A run's partitions: compaction of a resumed run, tenants kept apart, the one line of a failed run, and an
output root that is a path, never a pattern (issue 22: `out[12]` reached out1/ and out2/)."""
from __future__ import annotations

import datetime as dt
import errno
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines import cli
from schemas import tables
from schemas.layout import partition
from tests import docmaker
from transforms.output.run_root import clear_run, compact_run, run_failure, run_files, run_tenants, tenant_files
from transforms.output.write import write_rows


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
