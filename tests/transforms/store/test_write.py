"""The writer: atomic Parquet files written as the run goes, where the writer sits in a Beam graph, a full disk."""
from __future__ import annotations

import errno
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

from schemas import tables
from schemas.layout import partition
from tests.support.disk_faults import FullDisk
from transforms.store.write import (
    AttemptSequence,
    FlushPolicy,
    WriteParquetBundles,
    WriteTable,
    flatten_branches,
    write_rows,
)


def test_write_rows_leaves_no_partial_file(tmp_path: Path) -> None:
    folder = tmp_path / "documents" / "run_id=r"
    path = write_rows(str(folder), tables.DOCUMENTS, [{"run_id": "r", "source_uri": "a", "outcome": "rejected"}])
    assert Path(path).exists() and path.endswith(".parquet")
    assert [p.name for p in folder.iterdir()] == [Path(path).name]  # the .inprogress name is gone
    assert pq.read_table(path).schema.equals(tables.DOCUMENTS)


# Writing as the run goes: the flush policy, the writer DoFn, and where it sits in a Beam graph.

def test_flush_policy_is_due_at_the_row_limit_or_the_age_limit() -> None:
    policy = FlushPolicy(rows=3, seconds=10.0)
    assert not policy.due(0, 99.0)  # nothing buffered: nothing to write, however old
    assert not policy.due(2, 9.9)
    assert policy.due(3, 0.0)
    assert policy.due(1, 10.0)
    assert not FlushPolicy(rows=0, seconds=0).due(10_000, 10_000.0)  # both off: only bundle ends write
    assert FlushPolicy(rows=0, seconds=5).due(1, 5.0) and not FlushPolicy(rows=0, seconds=5).due(10_000, 4.9)
    assert FlushPolicy(rows=2, seconds=0).due(2, 0.0) and not FlushPolicy(rows=2, seconds=0).due(1, 1e9)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _doc(i: int) -> dict:
    return {"run_id": "r", "source_uri": f"s3://b/{i}.pdf", "outcome": "extracted"}


def _on_disk(folder: Path) -> list[str]:
    """What a reader sees: the rows of every finished file under a table's folder (readers list *.parquet)."""
    return sorted(r["source_uri"] for f in folder.rglob("*.parquet") for r in pq.read_table(f).to_pylist())


def test_writer_flushes_within_a_bundle_by_rows_and_by_age(tmp_path: Path) -> None:
    clock = _Clock()
    writer = WriteParquetBundles(partition(str(tmp_path), "documents", "t", "r"), "documents",
                                 FlushPolicy(rows=3, seconds=5.0), clock)
    folder = tmp_path / "documents"
    writer.setup()
    writer.start_bundle()
    for i in range(2):
        list(writer.process(_doc(i)))
    assert _on_disk(folder) == []  # under both limits: still buffered
    list(writer.process(_doc(2)))
    assert len(_on_disk(folder)) == 3  # the row limit wrote them, mid-bundle
    list(writer.process(_doc(3)))
    clock.now = 4.9
    list(writer.process(_doc(4)))
    assert len(_on_disk(folder)) == 3
    clock.now = 5.0  # the oldest buffered row (doc 3, at 0.0) is now 5 s old
    list(writer.process(_doc(5)))
    assert len(_on_disk(folder)) == 6
    list(writer.process(_doc(6)))
    writer.finish_bundle()  # the rest goes at the bundle's end
    assert _on_disk(folder) == sorted(_doc(i)["source_uri"] for i in range(7))
    assert len(list(folder.rglob("*.parquet"))) == 3
    assert not list(folder.rglob("*.inprogress"))


def test_writer_with_flushing_off_writes_once_per_bundle(tmp_path: Path) -> None:
    writer = WriteParquetBundles(partition(str(tmp_path), "documents", "t", "r"), "documents",
                                 FlushPolicy(rows=0, seconds=0))
    writer.setup()
    for bundle in range(2):
        writer.start_bundle()
        for i in range(50):
            list(writer.process(_doc(bundle * 50 + i)))
        writer.finish_bundle()
    writer.start_bundle()
    writer.finish_bundle()  # an empty bundle writes no empty file
    folder = tmp_path / "documents"
    assert len(list(folder.rglob("*.parquet"))) == 2 and len(_on_disk(folder)) == 100


def test_attempt_numbers_rise_even_when_the_clock_stands_still_or_steps_back() -> None:
    readings = iter([100, 100, 90, 250])
    seq = AttemptSequence(clock=lambda: next(readings))
    assert [seq(), seq(), seq(), seq()] == [100, 101, 102, 250]


def test_the_writer_numbers_each_row_it_receives_and_a_replayed_flush_keeps_the_numbers(tmp_path: Path) -> None:
    """A retried bundle's rows reach the writer again (process): later numbers. Rows flushed twice are one
    attempt's copies: same numbers (so the ledger counts that spend once)."""
    folder = tmp_path / "documents"
    writer = WriteParquetBundles(partition(str(tmp_path), "documents", "t", "r"), "documents",
                                 FlushPolicy(rows=0, seconds=0))
    writer.setup()
    seen: set[Path] = set()

    def written() -> int:
        (new,) = set(folder.rglob("*.parquet")) - seen
        seen.add(new)
        (row,) = pq.read_table(new).to_pylist()
        return row["attempt_seq"]

    numbers = []
    for _attempt in range(2):
        writer.start_bundle()
        list(writer.process(_doc(0)))
        buffered = list(writer.rows)
        writer.finish_bundle()
        numbers.append(written())
        writer.rows = buffered  # the replayed flush
        writer.flush()
        numbers.append(written())
    first, first_again, retry, retry_again = numbers
    assert first == first_again and retry == retry_again and first < retry


class _ProbeDisk(beam.DoFn):
    """Before passing element k on, record how many rows a reader could already see on disk."""

    def __init__(self, folder: str, log: str) -> None:
        self.folder, self.log = folder, log

    def process(self, element: int):
        seen = len(_on_disk(Path(self.folder)))
        with open(self.log, "a") as handle:
            handle.write(f"{seen}\n")
        yield _doc(element)


def test_rows_behind_a_flatten_reach_disk_while_their_stage_still_runs(tmp_path: Path) -> None:
    """The in-memory DirectRunner materialises a multi-input Flatten: a writer placed after it would
    see nothing until every input finished. WriteTable writes each branch inside its producer's stage."""
    folder, log = tmp_path / "documents", tmp_path / "probe.log"
    with beam.Pipeline() as p:
        slow = p | "Slow" >> beam.Create(list(range(6))) | beam.ParDo(_ProbeDisk(str(folder), str(log)))
        other = p | "Other" >> beam.Create([_doc(100)])
        both = (slow, other) | beam.Flatten()
        _ = (both, p | "Third" >> beam.Create([_doc(101)])) | "Again" >> beam.Flatten() \
            | WriteTable(str(tmp_path), "documents", "t", "r", FlushPolicy(rows=1, seconds=0))
    seen = [int(n) for n in log.read_text().split()]
    # Element k saw at least the k rows of its own branch before it already on disk.
    assert all(n >= k for k, n in enumerate(seen)), seen
    # Every row exactly once, although the graph has two Flattens over three branches.
    assert _on_disk(folder) == sorted([_doc(i)["source_uri"] for i in range(6)] + ["s3://b/100.pdf", "s3://b/101.pdf"])


def test_flatten_branches_finds_every_input_of_nested_flattens() -> None:
    p = beam.Pipeline()
    a, b, c = (p | f"C{i}" >> beam.Create([i]) for i in range(3))
    ab = (a, b) | "AB" >> beam.Flatten()
    abc = (ab, c) | "ABC" >> beam.Flatten()
    assert flatten_branches(abc) == [a, b, c]
    assert flatten_branches(a) == [a]


class _FullDisk:
    """A fault injector: the real local file is created, half the bytes land, then ENOSPC."""

    def __init__(self, real) -> None:
        self.real = real

    def __call__(self, path: str, *args, **kwargs):
        self.partial = path
        return FullDisk(self.real(path, *args, **kwargs), path)


def test_a_full_disk_leaves_no_half_written_file(tmp_path: Path, monkeypatch) -> None:
    from apache_beam.io.filesystems import FileSystems

    injector = _FullDisk(FileSystems.create)
    monkeypatch.setattr(FileSystems, "create", injector)
    folder = tmp_path / "pages" / "run_id=r"
    with pytest.raises(OSError) as caught:
        write_rows(str(folder), tables.DOCUMENTS, [_doc(0)])
    assert caught.value.errno == errno.ENOSPC
    assert injector.partial.endswith(".inprogress")  # the fault did strike mid-file
    assert list(folder.iterdir()) == []  # and the partial file is gone, not just hidden


def _page(i: int) -> dict:
    return {"run_id": "r", "tenant": "t", "doc_sha256": f"d{i}", "source_uri": f"s3://b/{i}.pdf", "page_index": 0,
            "status": "ok", "route": "model", "output_tokens": 10 + i}


def _pages_and_ledger(tmp_path: Path, policy: FlushPolicy) -> WriteParquetBundles:
    ledger = WriteParquetBundles(partition(str(tmp_path), "ledger", "t", "r"), "ledger", policy,
                                 to_row=lambda page: {**page, "cost_usd": 0.5})
    return WriteParquetBundles(partition(str(tmp_path), "pages", "t", "r"), "pages", policy,
                               to_row=dict, written_first=ledger)


def test_a_page_row_reaches_disk_only_after_its_ledger_row(tmp_path: Path, monkeypatch) -> None:
    """The two rows of a page share one writer: each flush writes the ledger's file first, so a run killed (here: a
    ledger write that fails) between them never leaves a `pages` row whose spend no `ledger` row records."""
    from apache_beam.io.filesystems import FileSystems

    writer = _pages_and_ledger(tmp_path, FlushPolicy(rows=2, seconds=0))
    writer.setup()
    writer.start_bundle()
    order: list[str] = []
    create = FileSystems.create

    def recording(path: str, *args, **kwargs):
        order.append(Path(path).parts[-4])  # <output>/<table>/tenant=t/run_id=r/<file>
        return create(path, *args, **kwargs)

    monkeypatch.setattr(FileSystems, "create", recording)
    for i in range(3):
        list(writer.process(_page(i)))
    assert order == ["ledger", "pages"]  # the row limit flushed both tables, the ledger first
    writer.finish_bundle()
    assert order == ["ledger", "pages"] * 2
    ledger = [r for f in (tmp_path / "ledger").rglob("*.parquet") for r in pq.read_table(f).to_pylist()]
    pages = _on_disk(tmp_path / "pages")
    assert sorted(r["source_uri"] for r in ledger) == pages == [f"s3://b/{i}.pdf" for i in range(3)]
    assert {r["cost_usd"] for r in ledger} == {0.5}  # each table's own row, made by its to_row

    monkeypatch.setattr(FileSystems, "create", _FullDisk(create))
    writer.start_bundle()
    list(writer.process(_page(3)))
    with pytest.raises(OSError):
        writer.finish_bundle()
    assert _on_disk(tmp_path / "pages") == pages  # the ledger's write failed: the page's row was not written
